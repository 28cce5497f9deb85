//! Calendar windows: a `fixed_window` whose windows are days, weeks, months
//! or years of one IANA time zone, each starting at local midnight
//! (`calendar: {period: month, timezone: Asia/Seoul, anchor_day: 1}`).
//!
//! A period's length varies (a month of 28-31 days, a day of 23 or 25
//! hours where the clocks change), so its bounds are computed from the
//! zone's rules (the `jiff` crate, with its bundled copy of the tz
//! database where the system has none) rather than by division. The
//! period around "now" is kept, so the common request costs a read lock
//! and two compares; the arithmetic runs once per period (BENCHMARKS.md).

use std::fmt;

/// The date and time library the calendar is computed with (re-exported:
/// front ends parse RFC 3339 times with the same one).
pub use jiff;
use jiff::civil::{Date, Weekday};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use crate::clock::Micros;

/// What a calendar window is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    /// Each local day.
    Day,
    /// Weeks from `anchor_weekday` (ISO: Monday).
    Week,
    /// Months from `anchor_day` (in a shorter month, its last day).
    Month,
    /// Years from `anchor_month` / `anchor_day` (January 1).
    Year,
}

impl Period {
    /// Its name in configuration.
    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
            Period::Year => "year",
        }
    }

    /// The period a configuration name means.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "day" => Period::Day,
            "week" => Period::Week,
            "month" => Period::Month,
            "year" => Period::Year,
            _ => return None,
        })
    }
}

/// The calendar of a window: a period in a zone, with its anchors.
pub struct Calendar {
    period: Period,
    zone_name: String,
    zone: TimeZone,
    /// 1-31 (months, years).
    anchor_day: i8,
    /// 1-12 (years).
    anchor_month: i8,
    /// The first day of a week.
    anchor_weekday: Weekday,
    /// The last period computed, `[start, end)` in µs since the epoch.
    cached: parking_lot::RwLock<(Micros, Micros)>,
}

impl Clone for Calendar {
    fn clone(&self) -> Self {
        Self {
            period: self.period,
            zone_name: self.zone_name.clone(),
            zone: self.zone.clone(),
            anchor_day: self.anchor_day,
            anchor_month: self.anchor_month,
            anchor_weekday: self.anchor_weekday,
            cached: parking_lot::RwLock::new(*self.cached.read()),
        }
    }
}

impl PartialEq for Calendar {
    fn eq(&self, o: &Self) -> bool {
        self.canonical() == o.canonical()
    }
}
impl Eq for Calendar {}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

/// Weekday names as configuration writes them.
const WEEKDAYS: [(&str, Weekday); 7] = [
    ("monday", Weekday::Monday),
    ("tuesday", Weekday::Tuesday),
    ("wednesday", Weekday::Wednesday),
    ("thursday", Weekday::Thursday),
    ("friday", Weekday::Friday),
    ("saturday", Weekday::Saturday),
    ("sunday", Weekday::Sunday),
];

/// Why a calendar cannot be built: the key at fault and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalendarError {
    /// `timezone`, `anchor_day`, `anchor_month` or `anchor_weekday`.
    pub key: &'static str,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for CalendarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Calendar {
    /// A calendar of `period` in the IANA zone `zone` (`UTC`,
    /// `Asia/Seoul`), or at a fixed offset from UTC (`+09:00`). `anchor_day` (1-31) applies to months and years,
    /// `anchor_month` (1-12) to years, `anchor_weekday` (`monday`..) to
    /// weeks; an anchor that does not apply to the period is an error.
    ///
    /// ```
    /// use ratewarden::calendar::{Calendar, Period};
    /// use ratewarden::clock::Micros;
    /// let c = Calendar::new(Period::Month, "UTC", Some(1), None, None).unwrap();
    /// // 2026-02-10T00:00:00Z is in February 2026: Feb 1 to Mar 1.
    /// let (start, end) = c.period(Micros::from_secs(1_770_681_600));
    /// assert_eq!((start, end), (Micros::from_secs(1_769_904_000), Micros::from_secs(1_772_323_200)));
    /// assert!(Calendar::new(Period::Day, "Mars/Olympus", None, None, None).is_err());
    /// ```
    pub fn new(
        period: Period,
        zone: &str,
        anchor_day: Option<i64>,
        anchor_month: Option<i64>,
        anchor_weekday: Option<&str>,
    ) -> Result<Self, CalendarError> {
        let err = |key, message: String| CalendarError { key, message };
        let tz = match fixed_offset(zone) {
            Some(secs) => jiff::tz::Offset::from_seconds(secs)
                .map_err(|_| err("timezone", format!("offset {zone:?} is out of range")))?
                .to_time_zone(),
            None => TimeZone::get(zone).map_err(|_| {
            err(
                "timezone",
                format!(
                    "unknown time zone {zone:?}: use an IANA name such as `UTC`, `Europe/Berlin` or `Asia/Seoul`"
                ),
            )
        })?,
        };
        let months_or_years = matches!(period, Period::Month | Period::Year);
        if anchor_day.is_some() && !months_or_years {
            return Err(err(
                "anchor_day",
                "`anchor_day` applies to `period: month` or `year`".into(),
            ));
        }
        if anchor_month.is_some() && period != Period::Year {
            return Err(err(
                "anchor_month",
                "`anchor_month` applies to `period: year`".into(),
            ));
        }
        if anchor_weekday.is_some() && period != Period::Week {
            return Err(err(
                "anchor_weekday",
                "`anchor_weekday` applies to `period: week`".into(),
            ));
        }
        let day = anchor_day.unwrap_or(1);
        if !(1..=31).contains(&day) {
            return Err(err("anchor_day", "`anchor_day` must be 1-31".into()));
        }
        let month = anchor_month.unwrap_or(1);
        if !(1..=12).contains(&month) {
            return Err(err("anchor_month", "`anchor_month` must be 1-12".into()));
        }
        let weekday = match anchor_weekday {
            None => Weekday::Monday,
            Some(w) => {
                let w = w.to_ascii_lowercase();
                WEEKDAYS
                    .iter()
                    .find(|(n, _)| *n == w || n[..3] == *w)
                    .map(|(_, d)| *d)
                    .ok_or_else(|| {
                        err(
                            "anchor_weekday",
                            format!(
                                "`anchor_weekday` {w:?} is not a day of the week (monday..sunday)"
                            ),
                        )
                    })?
            }
        };
        Ok(Self {
            period,
            zone_name: zone.to_owned(),
            zone: tz,
            anchor_day: day as i8,
            anchor_month: month as i8,
            anchor_weekday: weekday,
            cached: parking_lot::RwLock::new((Micros::ZERO, Micros::ZERO)),
        })
    }

    /// The period.
    pub fn period_kind(&self) -> Period {
        self.period
    }

    /// The zone's name as configured.
    pub fn zone(&self) -> &str {
        &self.zone_name
    }

    /// Every parameter as one fixed string (part of the rule's id).
    pub fn canonical(&self) -> String {
        format!(
            "{}@{}/d{}/m{}/w{}",
            self.period.name(),
            self.zone_name,
            self.anchor_day,
            self.anchor_month,
            self.anchor_weekday.to_monday_one_offset()
        )
    }

    /// The period holding `now`: `[start, end)`, µs since the epoch.
    pub fn period(&self, now: Micros) -> (Micros, Micros) {
        let (start, end) = *self.cached.read();
        if start <= now && now < end {
            return (start, end);
        }
        let bounds = self.compute(now);
        *self.cached.write() = bounds;
        bounds
    }

    /// [`period`](Self::period) without the cache: the arithmetic itself.
    pub fn compute(&self, now: Micros) -> (Micros, Micros) {
        let ts = Timestamp::from_microsecond(now.get().min(i64::MAX as u64) as i64)
            .unwrap_or(Timestamp::MAX);
        let today = self.zone.to_datetime(ts).date();
        let start = self.start_on_or_before(today);
        let end = self.next_start(start);
        (self.midnight(start), self.midnight(end))
    }

    /// The first day of the period holding `day`.
    fn start_on_or_before(&self, day: Date) -> Date {
        match self.period {
            Period::Day => day,
            Period::Week => {
                let back = (day.weekday().to_monday_zero_offset()
                    - self.anchor_weekday.to_monday_zero_offset())
                .rem_euclid(7);
                day.checked_sub(i64::from(back).days()).unwrap_or(day)
            }
            Period::Month => {
                let this = self.month_start(day.year(), day.month());
                if day >= this {
                    this
                } else {
                    let prev = day.first_of_month().checked_sub(1.day()).unwrap_or(day);
                    self.month_start(prev.year(), prev.month())
                }
            }
            Period::Year => {
                let this = self.month_start(day.year(), self.anchor_month);
                if day >= this {
                    this
                } else {
                    self.month_start(day.year() - 1, self.anchor_month)
                }
            }
        }
    }

    /// The first day of the period after the one starting `start`.
    fn next_start(&self, start: Date) -> Date {
        let or = |d: Result<Date, jiff::Error>| d.unwrap_or(Date::MAX);
        match self.period {
            Period::Day => or(start.checked_add(1.day())),
            Period::Week => or(start.checked_add(7.days())),
            Period::Month => {
                let next = or(start.first_of_month().checked_add(1.month()));
                self.month_start(next.year(), next.month())
            }
            Period::Year => self.month_start(start.year() + 1, self.anchor_month),
        }
    }

    /// The anchor day of month `month` of `year`, or the month's last day.
    fn month_start(&self, year: i16, month: i8) -> Date {
        let first = Date::new(year, month, 1).unwrap_or(Date::MAX);
        let day = self.anchor_day.min(first.days_in_month());
        Date::new(year, month, day).unwrap_or(first)
    }

    /// The first instant of `day` in the zone (its midnight, or where a
    /// change of clocks skips midnight, the first time it has).
    fn midnight(&self, day: Date) -> Micros {
        let at = day
            .to_zoned_datetime(self.zone.clone())
            .map(|z| z.timestamp().as_microsecond())
            .unwrap_or(i64::MAX);
        Micros::new(at.max(0) as u64)
    }
}

/// A fixed offset from UTC, `+09:00`, `-03:30` or `+05:45:10`, in
/// seconds; `None` for anything else (an IANA name).
fn fixed_offset(zone: &str) -> Option<i32> {
    let (sign, rest) = match zone.as_bytes().first()? {
        b'+' => (1, &zone[1..]),
        b'-' => (-1, &zone[1..]),
        _ => return None,
    };
    let mut secs = 0i32;
    let mut parts = 0;
    for (i, p) in rest.split(':').enumerate() {
        if i > 2 || p.len() != 2 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: i32 = p.parse().ok()?;
        if i > 0 && n > 59 {
            return None;
        }
        secs = secs * 60 + n;
        parts += 1;
    }
    if parts < 2 {
        return None;
    }
    if parts == 2 {
        secs *= 60;
    }
    Some(sign * secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Micros {
        let ts: Timestamp = s.parse().unwrap();
        Micros::new(ts.as_microsecond() as u64)
    }

    fn cal(p: Period, zone: &str, day: Option<i64>) -> Calendar {
        Calendar::new(p, zone, day, None, None).unwrap()
    }

    #[test]
    fn a_month_ends_on_the_last_of_february_in_leap_and_common_years() {
        let c = cal(Period::Month, "UTC", None);
        assert_eq!(
            c.period(at("2027-02-28T23:59:59Z")),
            (at("2027-02-01T00:00:00Z"), at("2027-03-01T00:00:00Z"))
        );
        assert_eq!(
            c.period(at("2028-02-29T12:00:00Z")),
            (at("2028-02-01T00:00:00Z"), at("2028-03-01T00:00:00Z"))
        );
    }

    #[test]
    fn anchor_day_31_is_the_last_day_of_a_shorter_month() {
        let c = cal(Period::Month, "UTC", Some(31));
        // April has 30 days: its period starts April 30 and runs to May 31.
        assert_eq!(
            c.period(at("2027-05-10T00:00:00Z")),
            (at("2027-04-30T00:00:00Z"), at("2027-05-31T00:00:00Z"))
        );
        // Before April 30, March 31's period.
        assert_eq!(
            c.period(at("2027-04-29T23:00:00Z")),
            (at("2027-03-31T00:00:00Z"), at("2027-04-30T00:00:00Z"))
        );
        // February (2028: 29 days).
        assert_eq!(
            c.period(at("2028-03-01T00:00:00Z")),
            (at("2028-02-29T00:00:00Z"), at("2028-03-31T00:00:00Z"))
        );
    }

    #[test]
    fn days_of_23_and_25_hours_are_exact_where_clocks_change() {
        let hour = 3_600_000_000;
        let berlin = cal(Period::Day, "Europe/Berlin", None);
        // 2027-03-28: Berlin springs forward, a 23-hour day.
        let (s, e) = berlin.period(at("2027-03-28T12:00:00Z"));
        assert_eq!(s, at("2027-03-27T23:00:00Z"));
        assert_eq!((e - s).get(), 23 * hour);
        // 2027-10-31: falls back, 25 hours.
        let (s, e) = berlin.period(at("2027-10-31T12:00:00Z"));
        assert_eq!(s, at("2027-10-30T22:00:00Z"));
        assert_eq!((e - s).get(), 25 * hour);
        let ny = cal(Period::Day, "America/New_York", None);
        let (s, e) = ny.period(at("2027-03-14T12:00:00Z"));
        assert_eq!(s, at("2027-03-14T05:00:00Z"));
        assert_eq!((e - s).get(), 23 * hour);
        let (s, e) = ny.period(at("2027-11-07T12:00:00Z"));
        assert_eq!(s, at("2027-11-07T04:00:00Z"));
        assert_eq!((e - s).get(), 25 * hour);
    }

    #[test]
    fn a_month_starts_at_local_midnight() {
        let c = cal(Period::Month, "Asia/Seoul", Some(1));
        // 2027-01-31T15:00Z is Feb 1 00:00 in Seoul (UTC+9).
        let (s, e) = c.period(at("2027-01-31T15:00:00Z"));
        assert_eq!(s, at("2027-01-31T15:00:00Z"));
        assert_eq!(e, at("2027-02-28T15:00:00Z"));
        let (_, e) = c.period(at("2027-01-31T14:59:59Z"));
        assert_eq!(e, at("2027-01-31T15:00:00Z"));
    }

    #[test]
    fn weeks_start_on_monday_unless_anchored() {
        let iso = cal(Period::Week, "UTC", None);
        // 2027-01-07 is a Thursday.
        assert_eq!(
            iso.period(at("2027-01-07T10:00:00Z")),
            (at("2027-01-04T00:00:00Z"), at("2027-01-11T00:00:00Z"))
        );
        assert_eq!(
            iso.period(at("2027-01-04T00:00:00Z")).0,
            at("2027-01-04T00:00:00Z")
        );
        let sunday = Calendar::new(Period::Week, "UTC", None, None, Some("sunday")).unwrap();
        assert_eq!(
            sunday.period(at("2027-01-07T10:00:00Z")),
            (at("2027-01-03T00:00:00Z"), at("2027-01-10T00:00:00Z"))
        );
        assert!(Calendar::new(Period::Week, "UTC", None, None, Some("funday")).is_err());
    }

    #[test]
    fn years_from_an_anchor() {
        let fiscal = Calendar::new(Period::Year, "UTC", Some(1), Some(4), None).unwrap();
        assert_eq!(
            fiscal.period(at("2027-02-01T00:00:00Z")),
            (at("2026-04-01T00:00:00Z"), at("2027-04-01T00:00:00Z"))
        );
        let plain = cal(Period::Year, "UTC", None);
        assert_eq!(
            plain.period(at("2027-12-31T23:59:59Z")),
            (at("2027-01-01T00:00:00Z"), at("2028-01-01T00:00:00Z"))
        );
    }

    #[test]
    fn a_fixed_offset_is_a_zone_too() {
        assert_eq!(fixed_offset("+09:00"), Some(9 * 3600));
        assert_eq!(fixed_offset("-03:30"), Some(-(3 * 3600 + 1800)));
        assert_eq!(fixed_offset("+05:45:10"), Some(5 * 3600 + 45 * 60 + 10));
        for bad in ["+9", "+09", "09:00", "+09:60", "+09:00:00:00", "+0a:00"] {
            assert_eq!(fixed_offset(bad), None, "{bad}");
        }
        let c = cal(Period::Day, "+09:00", None);
        assert_eq!(
            c.period(at("2027-01-31T16:00:00Z")),
            (at("2027-01-31T15:00:00Z"), at("2027-02-01T15:00:00Z"))
        );
    }

    #[test]
    fn anchors_that_do_not_apply_and_unknown_zones_are_refused() {
        let e = Calendar::new(Period::Day, "UTC", Some(3), None, None).unwrap_err();
        assert_eq!(e.key, "anchor_day");
        let e = Calendar::new(Period::Month, "Nowhere/Town", None, None, None).unwrap_err();
        assert_eq!(e.key, "timezone");
        let e = Calendar::new(Period::Month, "UTC", Some(32), None, None).unwrap_err();
        assert_eq!(e.key, "anchor_day");
    }

    #[test]
    fn the_cache_answers_as_the_arithmetic_does_across_a_boundary() {
        let c = cal(Period::Day, "Europe/Berlin", None);
        let mut t = at("2027-03-27T22:00:00Z");
        for _ in 0..100 {
            assert_eq!(c.period(t), c.compute(t));
            t += Micros::from_secs(1_800);
        }
    }
}
