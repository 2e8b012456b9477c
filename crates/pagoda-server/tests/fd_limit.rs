//! At the open-file limit: with every file descriptor of the process taken
//! and clients waiting to be accepted, the accept loop backs off instead of
//! spinning on EMFILE, and answers `/health` soon after descriptors free
//! up, while the idle clients still hold their connections. (Its own test
//! binary: it lowers the limit of the whole process.)

#![cfg(target_os = "linux")]

mod common;

use common::*;
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use std::time::{Duration, Instant};

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

/// User + system CPU time of the process, in clock ticks (1/100 s; an
/// accept loop spinning on EMFILE burns 20+ in the 0.7 s below), read
/// from `stat` (opened beforehand: at the limit nothing else can be).
fn cpu_ticks(stat: &mut std::fs::File) -> u64 {
    use std::io::{Read, Seek};
    let mut text = String::new();
    stat.rewind().unwrap();
    stat.read_to_string(&mut text).unwrap();
    // Fields after the command name (which is in parentheses).
    let rest = &text[text.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_fd_limit_the_server_backs_off_and_recovers() {
    let s = start(Options {
        config: |c| c.header_read_timeout = Duration::from_secs(1),
        ..Options::default()
    })
    .await;
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    assert_eq!(
        fresh.get(s.url("/health")).send().await.unwrap().status(),
        200
    );

    let mut stat = std::fs::File::open("/proc/self/stat").unwrap();
    let saved = getrlimit(Resource::Nofile);
    let limit = open_fds() + 40;
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(limit),
            maximum: saved.maximum,
        },
    )
    .unwrap();

    // Client sockets made first, then every descriptor left taken, then
    // the clients connect: the server cannot accept them (EMFILE).
    let sockets: Vec<_> = (0..16)
        .map(|_| tokio::net::TcpSocket::new_v4().unwrap())
        .collect();
    let mut filler = Vec::new();
    let err = loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => filler.push(f),
            Err(e) => break e,
        }
        assert!(filler.len() < 1000, "the limit does not hold");
    };
    assert_eq!(err.raw_os_error(), Some(24), "{err}"); // EMFILE
    let addr = s.addr().parse().unwrap();
    let mut idle = Vec::new();
    for socket in sockets {
        idle.push(socket.connect(addr).await.unwrap());
    }

    // No spinning on EMFILE while clients wait and no descriptor is free.
    let (t0, c0) = (Instant::now(), cpu_ticks(&mut stat));
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (wall, cpu) = (t0.elapsed(), cpu_ticks(&mut stat) - c0);
    assert!(cpu <= 10, "{cpu} ticks of CPU in {wall:?}");

    // Descriptors free up: the server accepts the waiting clients (the
    // header timeout cuts them) and answers /health.
    drop(filler);
    let t = Instant::now();
    let status = loop {
        match fresh
            .get(s.url("/health"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
        {
            Ok(r) => break Some(r.status().as_u16()),
            Err(_) if t.elapsed() < Duration::from_secs(8) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(_) => break None,
        }
    };
    let took = t.elapsed();
    setrlimit(Resource::Nofile, saved).unwrap();
    assert_eq!(status, Some(200), "after {took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    drop(idle);
}
