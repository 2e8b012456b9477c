//! A small `strftime` for chat templates (`strftime_now("%d %b %Y")`).
//!
//! Covers the directives templates use: `%Y %y %m %d %e %H %I %M %S %p %b %B
//! %a %A %j %%`, plus glibc's `%-d`-style no-padding flag. Anything else is
//! written out unchanged. Time is UTC; no locale (English names).

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CivilTime {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Monday .. 6 = Sunday
    pub weekday: u32,
    /// 1..=366
    pub day_of_year: u32,
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Seconds since the Unix epoch -> UTC calendar fields (proleptic Gregorian).
pub(crate) fn civil_from_unix(secs: i64) -> CivilTime {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400) as u32;
    // 1970-01-01 was a Thursday (weekday 3 with Monday = 0).
    let weekday = (days + 3).rem_euclid(7) as u32;
    // Walk years then months; at most a few thousand steps for any sane clock.
    let mut year = 1970i64;
    let mut d = days;
    loop {
        let len = if is_leap(year) { 366 } else { 365 };
        if d < 0 {
            year -= 1;
            d += if is_leap(year) { 366 } else { 365 };
        } else if d >= len {
            d -= len;
            year += 1;
        } else {
            break;
        }
    }
    let day_of_year = d as u32 + 1;
    let month_lens = [
        31,
        if is_leap(year) { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let mut month = 0usize;
    let mut d = d as u32;
    while d >= month_lens[month] {
        d -= month_lens[month];
        month += 1;
    }
    CivilTime {
        year,
        month: month as u32 + 1,
        day: d + 1,
        hour: rem / 3600,
        minute: rem / 60 % 60,
        second: rem % 60,
        weekday,
        day_of_year,
    }
}

/// Formats `secs` (Unix time, UTC) with a strftime `format`.
pub(crate) fn format_utc(format: &str, secs: i64) -> String {
    let t = civil_from_unix(secs);
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let pad = if spec == Some('-') {
            spec = chars.next();
            false
        } else {
            true
        };
        let num = |v: u32, width: usize| {
            if pad {
                format!("{v:0width$}")
            } else {
                v.to_string()
            }
        };
        let hour12 = match t.hour % 12 {
            0 => 12,
            h => h,
        };
        match spec {
            Some('Y') => out.push_str(&t.year.to_string()),
            Some('y') => out.push_str(&num(t.year.rem_euclid(100) as u32, 2)),
            Some('m') => out.push_str(&num(t.month, 2)),
            Some('d') => out.push_str(&num(t.day, 2)),
            Some('e') => out.push_str(&format!("{:>2}", t.day)),
            Some('H') => out.push_str(&num(t.hour, 2)),
            Some('I') => out.push_str(&num(hour12, 2)),
            Some('M') => out.push_str(&num(t.minute, 2)),
            Some('S') => out.push_str(&num(t.second, 2)),
            Some('p') => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            Some('j') => out.push_str(&num(t.day_of_year, 3)),
            Some('B') => out.push_str(MONTHS[t.month as usize - 1]),
            Some('b') | Some('h') => out.push_str(&MONTHS[t.month as usize - 1][..3]),
            Some('A') => out.push_str(WEEKDAYS[t.weekday as usize]),
            Some('a') => out.push_str(&WEEKDAYS[t.weekday as usize][..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if !pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference values: `date -u -d @SECS` (GNU coreutils).
    #[test]
    fn known_instants() {
        assert_eq!(
            format_utc("%Y-%m-%d %H:%M:%S %a", 0),
            "1970-01-01 00:00:00 Thu"
        );
        // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
        assert_eq!(
            format_utc("%d %b %Y %A %j %I%p %-d %B", 1_709_211_909),
            "29 Feb 2024 Thursday 060 01PM 29 February"
        );
        // 2000-12-31 23:59:59 UTC (day 366 of a leap century year).
        assert_eq!(format_utc("%j %y %e", 978_307_199), "366 00 31");
        assert_eq!(format_utc("100%% %Q", 0), "100% %Q");
    }

    #[test]
    fn before_the_epoch() {
        // 1969-12-31 23:59:59 UTC, a Wednesday.
        assert_eq!(
            format_utc("%Y-%m-%d %H:%M:%S %a", -1),
            "1969-12-31 23:59:59 Wed"
        );
    }
}
