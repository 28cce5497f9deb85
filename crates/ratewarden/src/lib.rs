//! # ratewarden
//!
//! Exact rate limiting: seven algorithms (`fixed_window`, `sliding_window_log`,
//! `sliding_window_counter`, `token_bucket`, `leaky_bucket`, `gcra`, and
//! `concurrency`, which limits requests in flight), bans with escalation,
//! minimum intervals, failure-only counting with reset on success, and
//! stores that make every decision atomic.
//!
//! The pieces, from the bottom up:
//!
//! * [`clock`]: time as integer microseconds, injected ([`clock::ManualClock`] in tests);
//! * [`algorithm`]: each algorithm as a pure transition of a key's state;
//! * [`Rule`]: an algorithm with its limit and the modifiers of the spec;
//! * [`store`]: where key states live ([`MemoryStore`]; Redis in its own module);
//! * [`Limiter`]: decisions over a store, returning a [`Decision`] that renders
//!   its own HTTP headers and problem body.
//!
//! ```
//! use std::time::Duration;
//! use ratewarden::{Limiter, MemoryStore, Penalty, Rule, clock::ManualClock};
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! // The coupon endpoint of a DRF post: 10 wrong codes per 5 minutes, then a
//! // 10-minute freeze; a right code wipes the slate.
//! let clock = ManualClock::new(1_700_000_000_000_000);
//! let limiter = Limiter::new(MemoryStore::builder().clock(clock.clone()).build());
//! let coupon = Rule::builder("coupon")
//!     .limit(10, Duration::from_secs(300))
//!     .penalty(Penalty::fixed(Duration::from_secs(600)))
//!     .count_failures(true)
//!     .build()
//!     .unwrap();
//! let op = [ratewarden::Op::new(&coupon, "user-42")];
//! for _ in 0..10 {
//!     let a = limiter.acquire(&op, 1).await.unwrap();
//!     assert!(a.decision.allowed);
//!     limiter.report(&a.pending.unwrap(), true).await.unwrap(); // wrong code
//! }
//! let eleventh = limiter.acquire(&op, 1).await.unwrap().decision;
//! assert_eq!(eleventh.retry_after_secs(), Some(600));
//! # });
//! ```

pub mod algorithm;
pub mod calendar;
pub mod clock;
pub mod decision;
mod limiter;
pub mod rule;
pub mod store;

pub use decision::{Decision, FieldRef, HeaderField, HeaderStyle, RuleDecision};
pub use limiter::{Admission, Limiter, Pending};
pub use rule::{
    Counting, Distribution, KeyState, Marks, Penalty, Reason, Rule, RuleError, RuleSpec, Variant,
    Verdict, fnv1a,
};
pub use store::memory::MemoryStore;
#[cfg(feature = "tls")]
pub use store::redis::RedisTls;
#[cfg(feature = "redis")]
pub use store::redis::{RedisConfig, RedisStore};
pub use store::{Fallback, Health, KeyInfo, Mode, OnError, Op, Settle, Store, StoreError};
