//! `strftime_now(format)` for chat templates: Python's `datetime.strftime` with
//! the C locale, on a date that can be fixed (for reproducible prompts and tests).

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// A calendar date and time of day, without time zone (Python's naive datetime).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DateTime {
    pub year: i32,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

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

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i32, m: u32, d: u32) -> i64 {
    let y = i64::from(y) - i64::from(m <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i32, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = (yoe + era * 400 + i64::from(m <= 2)) as i32;
    (y, m, d)
}

impl DateTime {
    /// The current time, UTC.
    pub fn now_utc() -> Self {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
        let rem = secs.rem_euclid(86_400) as u32;
        Self {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
        }
    }

    /// `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM[:SS]` (a space may replace the `T`).
    pub fn parse(s: &str) -> Option<Self> {
        let (date, time) = match s.split_once(['T', ' ']) {
            Some((d, t)) => (d, Some(t)),
            None => (s, None),
        };
        let mut d = date.split('-');
        let year = d.next()?.parse().ok()?;
        let month: u32 = d.next()?.parse().ok()?;
        let day: u32 = d.next()?.parse().ok()?;
        if d.next().is_some()
            || !(1..=12).contains(&month)
            || day == 0
            || day > days_in_month(year, month)
        {
            return None;
        }
        let (mut hour, mut minute, mut second) = (0, 0, 0);
        if let Some(t) = time {
            let mut t = t.split(':');
            hour = t.next()?.parse().ok()?;
            minute = t.next()?.parse().ok()?;
            second = t.next().map(str::parse).transpose().ok()?.unwrap_or(0);
            if t.next().is_some() || hour > 23 || minute > 59 || second > 59 {
                return None;
            }
        }
        Some(Self {
            year,
            month,
            day,
            hour,
            minute,
            second,
        })
    }

    /// The month's English name ("???" for a month outside 1..=12).
    fn month_name(&self) -> &'static str {
        MONTHS
            .get((self.month as usize).wrapping_sub(1))
            .copied()
            .unwrap_or("???")
    }

    /// 0 = Monday.
    fn weekday(&self) -> usize {
        (days_from_civil(self.year, self.month, self.day) + 3).rem_euclid(7) as usize
    }

    fn day_of_year(&self) -> i64 {
        days_from_civil(self.year, self.month, self.day) - days_from_civil(self.year, 1, 1) + 1
    }

    /// Formats like C's `strftime` in the C locale, with glibc's `%-d` (no
    /// padding) and `%e` (space padding). Unknown directives are copied.
    pub fn strftime(&self, format: &str) -> String {
        let mut out = String::new();
        let mut chars = format.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let no_pad = chars.peek() == Some(&'-');
            if no_pad {
                chars.next();
            }
            let Some(d) = chars.next() else {
                out.push('%');
                break;
            };
            let num = |out: &mut String, v: i64, width: usize| {
                if no_pad {
                    let _ = write!(out, "{v}");
                } else {
                    let _ = write!(out, "{v:0width$}");
                }
            };
            let hour12 = if self.hour.is_multiple_of(12) {
                12
            } else {
                self.hour % 12
            };
            match d {
                'Y' => {
                    let _ = write!(out, "{}", self.year);
                }
                'y' => num(&mut out, i64::from(self.year.rem_euclid(100)), 2),
                'm' => num(&mut out, i64::from(self.month), 2),
                'd' => num(&mut out, i64::from(self.day), 2),
                'e' => {
                    let _ = write!(out, "{:2}", self.day);
                }
                'H' => num(&mut out, i64::from(self.hour), 2),
                'I' => num(&mut out, i64::from(hour12), 2),
                'M' => num(&mut out, i64::from(self.minute), 2),
                'S' => num(&mut out, i64::from(self.second), 2),
                'j' => num(&mut out, self.day_of_year(), 3),
                'p' => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                'B' => out.push_str(self.month_name()),
                'b' | 'h' => out.push_str(&self.month_name()[..3]),
                'A' => out.push_str(WEEKDAYS[self.weekday() % 7]),
                'a' => out.push_str(&WEEKDAYS[self.weekday() % 7][..3]),
                'u' => num(&mut out, self.weekday() as i64 + 1, 1),
                'w' => num(&mut out, (self.weekday() as i64 + 1) % 7, 1),
                'F' => {
                    let _ = write!(out, "{}-{:02}-{:02}", self.year, self.month, self.day);
                }
                'D' => {
                    let _ = write!(
                        out,
                        "{:02}/{:02}/{:02}",
                        self.month,
                        self.day,
                        self.year.rem_euclid(100)
                    );
                }
                'T' => {
                    let _ = write!(
                        out,
                        "{:02}:{:02}:{:02}",
                        self.hour, self.minute, self.second
                    );
                }
                'R' => {
                    let _ = write!(out, "{:02}:{:02}", self.hour, self.minute);
                }
                'c' => {
                    let _ = write!(
                        out,
                        "{} {} {:2} {:02}:{:02}:{:02} {}",
                        &WEEKDAYS[self.weekday() % 7][..3],
                        &self.month_name()[..3],
                        self.day,
                        self.hour,
                        self.minute,
                        self.second,
                        self.year
                    );
                }
                'x' => {
                    let _ = write!(
                        out,
                        "{:02}/{:02}/{:02}",
                        self.month,
                        self.day,
                        self.year.rem_euclid(100)
                    );
                }
                'X' => {
                    let _ = write!(
                        out,
                        "{:02}:{:02}:{:02}",
                        self.hour, self.minute, self.second
                    );
                }
                'Z' | 'z' => {} // naive datetime: empty, as in Python
                '%' => out.push('%'),
                other => {
                    out.push('%');
                    if no_pad {
                        out.push('-');
                    }
                    out.push(other);
                }
            }
        }
        out
    }
}

fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_python() {
        // datetime(2025, 1, 15, 10, 30).strftime(...) in CPython on Linux.
        let t = DateTime::parse("2025-01-15T10:30:00").unwrap();
        assert_eq!(t.strftime("%d %b %Y"), "15 Jan 2025");
        assert_eq!(t.strftime("%B %d, %Y"), "January 15, 2025");
        assert_eq!(t.strftime("%Y-%m-%d"), "2025-01-15");
        assert_eq!(
            t.strftime("%A %a %j %I %p %-d/%-m %e"),
            "Wednesday Wed 015 10 AM 15/1 15"
        );
        let leap = DateTime::parse("2024-02-29 23:05").unwrap();
        assert_eq!(leap.strftime("%c"), "Thu Feb 29 23:05:00 2024");
        assert!(DateTime::parse("2023-02-29").is_none());
    }

    #[test]
    fn civil_days_round_trip() {
        for z in [-800_000i64, -1, 0, 1, 19_737, 2_000_000] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
    }
}
