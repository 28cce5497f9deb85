//! What an answer settles after admission ([`Settle`]).

use super::Rule;

/// What a request's answer settles on its ops once it is known: the one
/// way a cost is corrected after admission, for every front end (the
/// gateway's end phase, gRPC's trailers, `/v1/report`, the tower layer,
/// Envoy's refunds). Each carries the weight it applies, which an op's own
/// weight replaces ([`Op::cost`](crate::store::Op::cost)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// The answer was a failure: the `count: failures` rules charge the
    /// request's cost at this weight (other rules are left alone).
    Failure(u64),
    /// The answer was a success: the `count: failures` rules with
    /// `reset_on_success` clear their key's history (its ban stays).
    Success,
    /// The answer cost this much more than admission charged: charged now,
    /// on every rule but `concurrency` (whose leases are not charges),
    /// past the limit if need be (the request has been served).
    Charge(u64),
    /// Admission charged this much more than the answer cost: given back,
    /// on every rule that can give back (see
    /// [`Algorithm::refund`](crate::algorithm::Algorithm::refund)); a key
    /// with no state is left alone.
    Refund(u64),
}

impl Settle {
    /// The weight it applies (0 for a success).
    pub fn weight(self) -> u64 {
        match self {
            Settle::Failure(w) | Settle::Charge(w) | Settle::Refund(w) => w,
            Settle::Success => 0,
        }
    }

    /// Whether it changes anything of an op under `rule`.
    pub fn applies_to(self, rule: &Rule) -> bool {
        match self {
            Settle::Failure(_) => rule.counts_failures(),
            Settle::Success => rule.counts_failures(),
            Settle::Charge(w) => w > 0 && !rule.spec().algorithm.holds_leases(),
            Settle::Refund(w) => w > 0,
        }
    }
}
