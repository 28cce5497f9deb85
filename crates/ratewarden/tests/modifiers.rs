//! The modifiers of SPEC §2 on every algorithm, through the memory store and a
//! manual clock.

use std::time::Duration;

use ratewarden::algorithm::Kind;
use ratewarden::clock::ManualClock;
use ratewarden::{Decision, Limiter, MemoryStore, Op, Penalty, Reason, Rule, Store};

const T0: u64 = 1_700_000_000_000_000;
const SEC: Duration = Duration::from_secs(1);

fn setup() -> (ManualClock, Limiter<MemoryStore>) {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    (clock, Limiter::new(store))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

async fn hit(l: &Limiter<MemoryStore>, rule: &Rule, key: &str) -> Decision {
    l.check(rule, key).await.unwrap()
}

#[test]
fn min_interval_admits_at_exactly_the_gap_on_every_algorithm() {
    rt().block_on(async {
        for kind in Kind::ALL {
            let (clock, l) = setup();
            let rule = Rule::builder("gap")
                .algorithm(kind)
                .limit(100, Duration::from_secs(60))
                .min_interval(Duration::from_secs(3))
                .build()
                .unwrap();
            assert!(hit(&l, &rule, "k").await.allowed, "{kind}");
            clock.advance(Duration::from_millis(2_999));
            let d = hit(&l, &rule, "k").await;
            assert!(!d.allowed, "{kind}");
            assert_eq!(d.rules[0].reason, Some(Reason::MinInterval));
            assert_eq!(d.rules[0].retry_after, Some(Duration::from_millis(1)));
            clock.advance(Duration::from_millis(1));
            assert!(hit(&l, &rule, "k").await.allowed, "{kind} at exactly 3 s");
        }
    });
}

#[test]
fn a_ban_lasts_its_length_is_not_extended_and_expires_on_every_algorithm() {
    rt().block_on(async {
        for kind in Kind::ALL {
            let (clock, l) = setup();
            let rule = Rule::builder("ban")
                .algorithm(kind)
                .limit(2, Duration::from_secs(10))
                .penalty(Penalty::fixed(Duration::from_secs(600)))
                .build()
                .unwrap();
            for _ in 0..2 {
                assert!(hit(&l, &rule, "k").await.allowed, "{kind}");
            }
            let d = hit(&l, &rule, "k").await;
            assert_eq!(d.retry_after_secs(), Some(600), "{kind}");
            assert_eq!(d.rules[0].reason, Some(Reason::Limit));
            // Hammering during the ban neither extends it nor gets through.
            for _ in 0..50 {
                clock.advance(SEC);
                let d = hit(&l, &rule, "k").await;
                assert_eq!(d.rules[0].reason, Some(Reason::Banned), "{kind}");
            }
            clock.advance(Duration::from_secs(549));
            let d = hit(&l, &rule, "k").await;
            assert_eq!(d.retry_after_secs(), Some(1), "{kind}");
            clock.advance(SEC);
            assert!(hit(&l, &rule, "k").await.allowed, "{kind} after the ban");
            let info = l.store().inspect(Op::new(&rule, "k"));
            assert_eq!(info.await.unwrap().ban_left, None);
        }
    });
}

#[test]
fn escalating_bans_multiply_up_to_max_and_are_forgotten_after_memory() {
    rt().block_on(async {
        let (clock, l) = setup();
        let rule = Rule::builder("esc")
            .algorithm(Kind::FixedWindow)
            .limit(1, Duration::from_secs(1))
            .penalty(Penalty {
                duration: Duration::from_secs(10),
                multiplier: 2,
                max: Duration::from_secs(30),
                memory: Duration::from_secs(100),
            })
            .build()
            .unwrap();
        let mut bans = vec![];
        for _ in 0..4 {
            clock.advance(Duration::from_secs(1));
            assert!(hit(&l, &rule, "k").await.allowed);
            let d = hit(&l, &rule, "k").await;
            let ban = d.retry_after_secs().unwrap();
            bans.push(ban);
            clock.advance(Duration::from_secs(ban));
        }
        assert_eq!(bans, [10, 20, 30, 30]);
        // Past the memory, the next ban starts over.
        clock.advance(Duration::from_secs(101));
        assert!(hit(&l, &rule, "k").await.allowed);
        assert_eq!(hit(&l, &rule, "k").await.retry_after_secs(), Some(10));
    });
}

#[test]
fn failures_only_counting_with_reset_on_success_is_the_coupon_flow() {
    rt().block_on(async {
        let (clock, l) = setup();
        let rule = Rule::builder("coupon")
            .algorithm(Kind::SlidingWindowLog)
            .limit(10, Duration::from_secs(300))
            .penalty(Penalty::fixed(Duration::from_secs(600)))
            .count_failures(true)
            .build()
            .unwrap();
        let ops = [Op::new(&rule, "user-42")];
        let attempt = |failure: bool| {
            let l = &l;
            let ops = &ops;
            async move {
                let a = l.acquire(ops, 1).await.unwrap();
                if let Some(p) = &a.pending {
                    l.report(p, failure).await.unwrap();
                }
                a.decision
            }
        };
        // Nine wrong codes, then a right one: the slate is wiped.
        for _ in 0..9 {
            assert!(attempt(true).await.allowed);
        }
        assert!(attempt(false).await.allowed);
        // Admitted-but-successful requests never count.
        for _ in 0..30 {
            assert!(attempt(false).await.allowed);
        }
        for i in 0..10 {
            let d = attempt(true).await;
            assert!(d.allowed, "wrong code {i}");
            assert_eq!(d.rules[0].remaining, 9 - i, "checked, not yet charged");
        }
        let d = attempt(false).await;
        assert!(!d.allowed);
        assert_eq!(d.retry_after_secs(), Some(600));
        // A right code during the freeze does not lift it.
        clock.advance(Duration::from_secs(300));
        let d = attempt(false).await;
        assert_eq!(d.rules[0].reason, Some(Reason::Banned));
        assert_eq!(d.retry_after_secs(), Some(300));
        clock.advance(Duration::from_secs(300));
        assert!(attempt(false).await.allowed);
    });
}

#[test]
fn count_rejected_keeps_a_hammering_client_blocked() {
    rt().block_on(async {
        for (count_rejected, admitted_at_end) in [(false, true), (true, false)] {
            let (clock, l) = setup();
            let rule = Rule::builder("hammer")
                .algorithm(Kind::SlidingWindowLog)
                .limit(5, Duration::from_secs(10))
                .count_rejected(count_rejected)
                .build()
                .unwrap();
            // One request a second for 12 s: 5 admitted, then hammering.
            for _ in 0..12 {
                hit(&l, &rule, "k").await;
                clock.advance(SEC);
            }
            assert_eq!(hit(&l, &rule, "k").await.allowed, admitted_at_end);
        }
    });
}

#[test]
fn shadow_rules_record_but_never_reject() {
    rt().block_on(async {
        let (_, l) = setup();
        let shadow = Rule::builder("trial")
            .algorithm(Kind::FixedWindow)
            .limit(2, Duration::from_secs(60))
            .shadow(true)
            .build()
            .unwrap();
        let ops = [Op::new(&shadow, "k")];
        let mut shadow_rejections = 0;
        for _ in 0..5 {
            let d = l.acquire(&ops, 1).await.unwrap().decision;
            assert!(d.allowed);
            assert_eq!(d.retry_after_secs(), None);
            shadow_rejections += usize::from(!d.rules[0].allowed());
            assert!(d.headers(Default::default()).is_empty());
        }
        assert_eq!(shadow_rejections, 3);
    });
}

#[test]
fn a_request_one_rule_rejects_is_charged_to_no_other_rule() {
    rt().block_on(async {
        let (_, l) = setup();
        let wide = Rule::builder("wide")
            .algorithm(Kind::FixedWindow)
            .limit(100, Duration::from_secs(60))
            .build()
            .unwrap();
        let narrow = Rule::builder("narrow")
            .algorithm(Kind::TokenBucket)
            .limit(3, Duration::from_secs(60))
            .build()
            .unwrap();
        let ops = [Op::new(&wide, "k"), Op::new(&narrow, "k")];
        let mut admitted = 0;
        for _ in 0..10 {
            let d = l.acquire(&ops, 1).await.unwrap().decision;
            admitted += u64::from(d.allowed);
            if !d.allowed {
                let names: Vec<_> = d.violated().map(|r| r.rule.name().to_owned()).collect();
                assert_eq!(names, ["narrow"]);
            }
        }
        assert_eq!(admitted, 3);
        let d = hit(&l, &wide, "k").await;
        assert_eq!(
            d.rules[0].remaining,
            100 - 3 - 1,
            "only admitted requests charged"
        );
    });
}

#[test]
fn cost_larger_than_the_limit_is_rejected_without_charge() {
    rt().block_on(async {
        for kind in Kind::ALL {
            let (_, l) = setup();
            let rule = Rule::builder("cost")
                .algorithm(kind)
                .limit(5, Duration::from_secs(60))
                .build()
                .unwrap();
            let d = l.acquire(&[Op::new(&rule, "k")], 6).await.unwrap();
            assert!(!d.decision.allowed, "{kind}");
            assert_eq!(d.decision.rules[0].retry_after, None, "{kind}: never fits");
            let d = l.acquire(&[Op::new(&rule, "k")], 5).await.unwrap();
            assert!(d.decision.allowed, "{kind}");
            assert_eq!(d.decision.rules[0].remaining, 0, "{kind}");
        }
    });
}

#[test]
fn rule_cost_multiplies_request_weight() {
    rt().block_on(async {
        let (_, l) = setup();
        let rule = Rule::builder("heavy")
            .algorithm(Kind::Gcra)
            .limit(10, Duration::from_secs(10))
            .cost(3)
            .build()
            .unwrap();
        let d = l.acquire(&[Op::new(&rule, "k")], 2).await.unwrap();
        assert_eq!(d.decision.rules[0].remaining, 4);
    });
}

#[test]
fn leaky_bucket_delay_mode_spaces_requests() {
    rt().block_on(async {
        let (clock, l) = setup();
        let rule = Rule::builder("smooth")
            .algorithm(Kind::LeakyBucket)
            .limit(5, SEC)
            .burst(3)
            .delay(Duration::from_millis(500))
            .build()
            .unwrap();
        let mut delays = vec![];
        for _ in 0..4 {
            let d = hit(&l, &rule, "k").await;
            delays.push(d.allowed.then_some(d.delay.as_millis()));
        }
        assert_eq!(delays, [Some(0), Some(200), Some(400), None]);
        clock.advance(Duration::from_millis(200));
        assert_eq!(hit(&l, &rule, "k").await.delay, Duration::from_millis(400));
    });
}

#[test]
fn peek_records_nothing_and_clear_forgets_bans() {
    rt().block_on(async {
        let (_, l) = setup();
        let rule = Rule::builder("r")
            .algorithm(Kind::FixedWindow)
            .limit(1, Duration::from_secs(60))
            .penalty(Penalty::fixed(Duration::from_secs(60)))
            .build()
            .unwrap();
        let op = [Op::new(&rule, "k")];
        for _ in 0..3 {
            assert!(l.peek(&op, 1).await.unwrap().allowed);
        }
        assert!(hit(&l, &rule, "k").await.allowed);
        assert!(!hit(&l, &rule, "k").await.allowed);
        let info = l.store().inspect(op[0]).await.unwrap();
        assert!(info.exists);
        assert_eq!(info.ban_left, Some(Duration::from_secs(60)));

        assert!(l.store().clear(op[0]).await.unwrap());
        assert!(hit(&l, &rule, "k").await.allowed);
    });
}

#[test]
fn invalid_rules_are_refused_with_a_reason() {
    let zero = Rule::builder("z").limit(0, SEC).build();
    assert!(zero.unwrap_err().to_string().contains("at least 1"));
    let burst = Rule::builder("b")
        .algorithm(Kind::FixedWindow)
        .burst(3)
        .build();
    assert!(burst.unwrap_err().to_string().contains("burst"));
    let name = Rule::builder("has space").build();
    assert!(matches!(name, Err(ratewarden::RuleError::BadName(_))));
    let window = Rule::builder("w").limit(1, Duration::ZERO).build();
    assert!(window.unwrap_err().to_string().contains("window"));
}

/// A refund gives back what a charge took: after charging 3 of 5 and
/// refunding them, a key reads as fresh again; refunding 1 reads as
/// having spent 2. On every algorithm but `concurrency` (leases instead),
/// at once and after part of a window.
#[test]
fn a_refund_undoes_a_charge_on_every_algorithm() {
    use ratewarden::algorithm::{Kind, State};
    use ratewarden::clock::Micros;
    for kind in Kind::ALL {
        if kind == Kind::Concurrency {
            continue;
        }
        let rule = ratewarden::Rule::builder("r")
            .algorithm(kind)
            .limit(5, Duration::from_secs(10))
            .build()
            .unwrap();
        let p = rule.params();
        for at in [10_000_000, 13_000_000] {
            let now = Micros::new(at);
            let fresh = p.check(&State::default(), now, 1);
            let mut two = State::default();
            p.charge(&mut two, now, 2);
            let mut s = State::default();
            p.charge(&mut s, now, 3);
            p.refund(&mut s, now, 1);
            assert_eq!(
                p.check(&s, now, 1),
                p.check(&two, now, 1),
                "{kind} at {at}: 3 - 1"
            );
            p.refund(&mut s, now, 2);
            assert_eq!(
                p.check(&s, now, 1).remaining,
                fresh.remaining,
                "{kind} at {at}: all back"
            );
            // Never past fresh.
            p.refund(&mut s, now, 10);
            assert_eq!(
                p.check(&s, now, 1).remaining,
                fresh.remaining,
                "{kind}: past fresh"
            );
        }
    }
}
