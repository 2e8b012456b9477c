//! Tests of the kernel compile units: every entry point declared in exactly
//! one unit, headers without entry points, a cache name per unit, and (where
//! libnvrtc can be opened, no GPU needed) every unit compiling on its own
//! into a CUBIN holding its kernels.

use super::*;

/// The `extern "C" __global__` names declared in the program (skipping
/// a `__launch_bounds__(...)` between the return type and the name).
fn declared_kernels(src: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (i, _) in src.match_indices("extern \"C\" __global__") {
        let mut rest = &src[i..];
        if let Some(lb) = rest.find("__launch_bounds__(") {
            if lb < rest.find('{').unwrap_or(0) && lb < rest.find(';').unwrap_or(usize::MAX) {
                let close = rest[lb..].find(')').map_or(rest.len(), |c| lb + c + 1);
                rest = &rest[close..];
            }
        }
        let open = rest.find('(').unwrap_or(rest.len());
        let Some(name) = rest[..open].split_whitespace().last() else {
            continue;
        };
        match name.split_once("##") {
            None => names.push(name.to_string()),
            Some((base, param)) => names.extend(
                pasted_names(src, i, param)
                    .into_iter()
                    .map(|suffix| format!("{base}{suffix}")),
            ),
        }
    }
    // A kernel declared by a macro (`#define M(NAME, ...)` whose body
    // declares `NAME`) is declared once per line `M(name, ...)`.
    for (i, _) in src.match_indices("#define ") {
        let line = &src[i + 8..];
        let Some(open) = line.find('(') else { continue };
        let (macro_name, params) = (&line[..open], &line[open + 1..]);
        let Some(first) = params.split([',', ')']).next().map(str::trim) else {
            continue;
        };
        if let Some(at) = names.iter().position(|n| n == first) {
            names.remove(at);
            for (j, _) in src.match_indices(&format!("\n{macro_name}(")) {
                let args = &src[j + macro_name.len() + 2..];
                if let Some(name) = args.split([',', ')']).next() {
                    names.push(name.trim().to_string());
                }
            }
        }
    }
    names
}

/// The values of macro parameter `param` in every line-initial invocation
/// of the macro whose `#define` is the last one before byte `decl` of `src`
/// (a kernel named `base##param` in the body of `#define M(.., param, ..)`
/// is declared once per line `M(..)`).
fn pasted_names(src: &str, decl: usize, param: &str) -> Vec<String> {
    let Some(d) = src[..decl].rfind("#define ") else {
        return Vec::new();
    };
    let line = &src[d + 8..decl];
    let (Some(open), Some(close)) = (line.find('('), line.find(')')) else {
        return Vec::new();
    };
    let macro_name = &line[..open];
    let Some(at) = line[open + 1..close]
        .split(',')
        .position(|p| p.trim() == param)
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (j, _) in src.match_indices(&format!("\n{macro_name}(")) {
        let args = &src[j + macro_name.len() + 2..];
        let args = &args[..args.find(')').unwrap_or(args.len())];
        if let Some(a) = args.split(',').nth(at) {
            out.push(a.trim().to_string());
        }
    }
    out
}

/// The units' programs, in [`UNITS`] order.
fn unit_sources() -> Vec<String> {
    UNITS
        .iter()
        .map(|(_, files)| unit_source(files).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// The kernels each unit declares, in [`UNITS`] order.
fn declared_per_unit() -> Vec<Vec<String>> {
    unit_sources().iter().map(|s| declared_kernels(s)).collect()
}

#[test]
fn every_loaded_kernel_is_declared_in_exactly_one_unit_and_every_declared_one_is_loaded() {
    let per_unit = declared_per_unit();
    for k in KERNELS {
        let n: usize = per_unit
            .iter()
            .map(|d| d.iter().filter(|x| x == k).count())
            .sum();
        assert_eq!(n, 1, "{k} declared {n} times over the units");
    }
    for d in per_unit.iter().flatten() {
        assert!(KERNELS.contains(&d.as_str()), "{d} is never loaded");
    }
}

#[test]
fn every_source_with_kernels_is_in_exactly_one_unit_and_headers_declare_none() {
    for (name, src) in SOURCES {
        let in_units = UNITS.iter().filter(|(_, f)| f.contains(name)).count();
        let declares = src.contains("__global__");
        if name.ends_with(".cuh") {
            assert!(!declares, "header {name} declares a kernel");
        } else {
            assert!(name.ends_with(".cu"), "{name}: sources are .cu or .cuh");
            assert!(in_units >= 1, "{name} is in no unit");
        }
        if declares {
            assert_eq!(
                in_units, 1,
                "{name} declares kernels and is in {in_units} units"
            );
        }
    }
    assert!(
        !UNITS.iter().any(|(_, f)| f.contains(&"prelude.cuh")),
        "the prelude is implicit"
    );
    let mut names: Vec<_> = UNITS.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), UNITS.len(), "unit names are unique");
    for (unit, files) in UNITS {
        for f in *files {
            assert!(source_text(f).is_some(), "{unit}: unknown source {f}");
            let n = files.iter().filter(|g| *g == f).count();
            assert_eq!(n, 1, "{unit} lists {f} {n} times");
        }
        // Headers before the files that use them.
        let first_cu = files.iter().position(|f| f.ends_with(".cu"));
        let last_cuh = files.iter().rposition(|f| f.ends_with(".cuh"));
        if let (Some(cu), Some(cuh)) = (first_cu, last_cuh) {
            assert!(cuh < cu, "{unit}: headers come first");
        }
    }
}

#[test]
fn unit_sources_start_with_the_prelude_and_mark_each_file_in_order() {
    for ((unit, files), s) in UNITS.iter().zip(unit_sources()) {
        assert!(s.starts_with("#line 1 \"prelude.cuh\"\n"), "{unit}");
        let mut at = 0;
        for name in *files {
            let marker = format!("#line 1 \"{name}\"");
            let i = s[at..].find(&marker).expect("marker present") + at;
            at = i + marker.len();
        }
        // Braces balance (a cheap guard against a truncated file).
        assert_eq!(s.matches('{').count(), s.matches('}').count(), "{unit}");
    }
    assert!(unit_source(&["nonexistent.cu"]).is_err());
}

#[test]
fn each_unit_has_its_own_cache_name_and_an_edit_changes_only_its_units() {
    let opts = options((9, 0), Path::new("/none"));
    let names: Vec<String> = unit_sources()
        .iter()
        .map(|s| cache_name(s, &opts, (13, 0)))
        .collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "one cache file per unit");
    // Editing gemv.cu renames the cache file of the units holding it only.
    let edited =
        Box::leak(format!("{}\n// edit\n", source_text("gemv.cu").unwrap()).into_boxed_str());
    let text = |n: &str| {
        if n == "gemv.cu" {
            Some(&*edited)
        } else {
            source_text(n)
        }
    };
    for ((unit, files), before) in UNITS.iter().zip(&names) {
        let after = cache_name(&unit_source_from(files, text).unwrap(), &opts, (13, 0));
        assert_eq!(files.contains(&"gemv.cu"), &after != before, "{unit}");
    }
}

#[test]
fn options_target_the_real_architecture() {
    let o = options((9, 0), Path::new("/nonexistent-cuda"));
    assert_eq!(o[0], "--gpu-architecture=sm_90");
    assert!(!o.iter().any(|x| x.starts_with("--include-path")));
    assert_eq!(
        options((12, 1), Path::new("/x"))[0],
        "--gpu-architecture=sm_121"
    );
}

#[test]
fn cache_name_depends_on_source_options_and_version() {
    let o90 = options((9, 0), Path::new("/none"));
    let o80 = options((8, 0), Path::new("/none"));
    let a = cache_name("x", &o90, (13, 0));
    assert_eq!(a, cache_name("x", &o90, (13, 0)));
    assert_ne!(a, cache_name("y", &o90, (13, 0)));
    assert_ne!(a, cache_name("x", &o80, (13, 0)));
    assert_ne!(a, cache_name("x", &o90, (13, 1)));
    assert!(a.starts_with("pagoda-") && a.ends_with(".cubin"));
}

/// Whether the CUBIN holds entry point `name` (its `.text.<name>` section).
fn cubin_has_kernel(cubin: &[u8], name: &str) -> bool {
    let needle = format!(".text.{name}\0");
    cubin.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Compiles every unit on its own for sm_90, concurrently, where libnvrtc
/// can be opened (no GPU needed), so a kernel or a unit that does not
/// compile fails here, not on the GPU; each module holds exactly the
/// kernels its unit declares, and together they hold every one of KERNELS.
#[test]
fn every_unit_compiles_alone_where_nvrtc_is_present() {
    // SAFETY: only tries to open the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("notice: libnvrtc not found; NVRTC compile test skipped");
        return;
    }
    let opts = options((9, 0), &cuda_home());
    let sources = unit_sources();
    let cubins: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = UNITS
            .iter()
            .zip(&sources)
            .map(|((unit, _), src)| s.spawn(|| compile(unit, src, &opts)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap_or_else(|e| panic!("{e}")))
            .collect()
    });
    let declared = declared_per_unit();
    for k in KERNELS {
        let holders: Vec<_> = UNITS
            .iter()
            .zip(&cubins)
            .filter(|(_, c)| cubin_has_kernel(c, k))
            .map(|((u, _), _)| *u)
            .collect();
        assert_eq!(holders.len(), 1, "{k} is in the modules {holders:?}");
    }
    for (((unit, _), cubin), names) in UNITS.iter().zip(&cubins).zip(&declared) {
        assert!(is_elf(cubin), "{unit}");
        for k in names {
            assert!(cubin_has_kernel(cubin, k), "{unit} lacks {k}");
        }
    }
}

#[test]
fn elf_check() {
    assert!(is_elf(b"\x7fELF\x02\x01"));
    assert!(!is_elf(b"// PTX"));
    assert!(!is_elf(b""));
}

/// Launches may carry the programmatic-dependent-launch attribute (see
/// `launch.rs`), so every kernel must wait for the previous one before it
/// reads anything: its body opens with `PDL_ENTRY();`.
#[test]
fn every_kernel_waits_for_the_previous_one_first() {
    let mut n = 0;
    for s in unit_sources() {
        for (i, _) in s.match_indices("extern \"C\" __global__") {
            let rest = &s[i..];
            let open = rest.find('{').expect("a body");
            assert!(!rest[..open].contains(';'), "a declaration without body");
            let body = rest[open + 1..].trim_start_matches([' ', '\\', '\n']);
            let head = &rest[..open.min(120)];
            assert!(body.starts_with("PDL_ENTRY();"), "{head}");
            n += 1;
        }
    }
    // Some bodies are macros that declare several kernels.
    assert!(n > 0 && n <= KERNELS.len(), "{n} kernel bodies");
    let prelude = source_text("prelude.cuh").expect("the prelude");
    assert!(prelude.contains("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900"));
    assert!(prelude.contains("griddepcontrol.wait;"));
}
