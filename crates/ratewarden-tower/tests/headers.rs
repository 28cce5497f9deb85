//! How decisions read over HTTP: legacy and draft-11 headers, problem bodies.

use std::time::Duration;

use ratewarden::algorithm::Kind;
use ratewarden::clock::ManualClock;
use ratewarden::{HeaderStyle, Limiter, MemoryStore, Op, Penalty, Rule};
use ratewarden_tower::problem::problem_json;

/// A field by its name, as HTTP compares names: case aside (they are
/// written lowercase).
fn header<'a>(h: &'a [(&'static str, String)], name: &str) -> Option<&'a str> {
    h.iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn rules() -> (Rule, Rule) {
    let per_client = Rule::builder("per-client")
        .algorithm(Kind::SlidingWindowLog)
        .limit(50, Duration::from_secs(60))
        .build()
        .unwrap();
    let comment = Rule::builder("comment-write")
        .algorithm(Kind::TokenBucket)
        .limit(5, Duration::from_secs(60))
        .burst(5)
        .min_interval(Duration::from_secs(3))
        .build()
        .unwrap();
    (per_client, comment)
}

#[tokio::test]
async fn two_rules_render_as_one_structured_field_list_each() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let l = Limiter::new(MemoryStore::builder().clock(clock.clone()).build());
    let (a, b) = rules();
    let ops = [Op::new(&a, "ip"), Op::new(&b, "ip")];
    let d = l.acquire(&ops, 1).await.unwrap().decision;
    let h = d.headers(HeaderStyle::default());
    assert_eq!(
        header(&h, "RateLimit-Policy"),
        Some(r#""per-client";q=50;w=60, "comment-write";q=5;w=60"#)
    );
    assert_eq!(
        header(&h, "RateLimit"),
        Some(r#""per-client";r=49;t=60, "comment-write";r=4;t=12"#)
    );
    // The legacy headers show the most restrictive rule.
    assert_eq!(header(&h, "X-RateLimit-Limit"), Some("5"));
    assert_eq!(header(&h, "X-RateLimit-Remaining"), Some("4"));
    assert_eq!(header(&h, "X-RateLimit-Reset"), Some("12"));
    assert_eq!(header(&h, "Retry-After"), None);

    // One second later the min_interval rejects: Retry-After 2, and `t` of
    // that rule is not earlier than it.
    clock.advance(Duration::from_secs(1));
    let d = l.acquire(&ops, 1).await.unwrap().decision;
    assert!(!d.allowed);
    let h = d.headers(HeaderStyle {
        legacy: true,
        ietf: true,
    });
    assert_eq!(header(&h, "Retry-After"), Some("2"));
    assert_eq!(header(&h, "X-RateLimit-Retry-After"), Some("2"));
    let body = problem_json(&d, 429).unwrap();
    assert!(body.starts_with(r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"violated-policies":["comment-write"],"rule":"comment-write","retry_after":2"#), "{body}");
    assert!(
        body.contains(r#""detail":"requests under rule comment-write must be at least 3s apart""#)
    );

    let none = d.headers(HeaderStyle {
        legacy: false,
        ietf: false,
    });
    assert_eq!(
        none,
        [("retry-after", "2".to_string())],
        "Retry-After is always sent on rejection"
    );
}

#[tokio::test]
async fn a_ban_sets_retry_after_t_and_the_detail() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let l = Limiter::new(MemoryStore::builder().clock(clock.clone()).build());
    let rule = Rule::builder("coupon")
        .limit(1, Duration::from_secs(300))
        .penalty(Penalty::fixed(Duration::from_secs(600)))
        .build()
        .unwrap();
    l.check(&rule, "u").await.unwrap();
    l.check(&rule, "u").await.unwrap();
    clock.advance(Duration::from_millis(100_500));
    let d = l.check(&rule, "u").await.unwrap();
    let h = d.headers(HeaderStyle::default());
    assert_eq!(header(&h, "Retry-After"), Some("500"), "499.5 s rounds up");
    assert_eq!(header(&h, "RateLimit"), Some(r#""coupon";r=0;t=500"#));
    let body = problem_json(&d, 429).unwrap();
    assert!(
        body.contains(
            r#""detail":"banned by rule coupon for exceeding its limit; 500 s left on the ban""#
        ),
        "{body}"
    );
    assert!(
        problem_json(&d, 503)
            .unwrap()
            .contains(r#""title":"Service Unavailable","status":503"#)
    );
}
