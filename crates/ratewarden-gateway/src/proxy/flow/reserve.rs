//! What the rules charged by an LLM's usage reserve of one request, read
//! from its body under its path; and what `cap_max_output` and
//! `include_usage` change of the body. One for every front end that
//! decides a request with a body: the proxy's flow, and the admin API's
//! `/v1/check` and `/v1/explain`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use ratewarden::Decision;
use ratewarden_tower::policy::PolicyRule;
use serde_json::Value;

use super::llm;
use crate::config::cost::{CostSource, CostSpec, Dialect, LlmCost};

/// One request's reservations, asked per rule by the admission path
/// ([`ratewarden_tower::admission::Reserve`]).
pub(crate) struct Reservations<'a> {
    costs: &'a [Arc<CostSpec>],
    /// The body's JSON, when it is a JSON object.
    json: Option<&'a Value>,
    /// The path as a rule sees it (`dialect: auto` reads it).
    path: &'a str,
    /// The body's length in bytes: the input bound.
    len: usize,
    /// `cap_max_output`'s output tokens a choice (`u64::MAX`: none).
    cap: AtomicU64,
    /// The first LLM rule matched's dialect and `include_usage`: what the
    /// body's edits follow.
    edits: OnceLock<Option<(Dialect, bool)>>,
}

impl<'a> Reservations<'a> {
    pub(crate) fn new(
        costs: &'a [Arc<CostSpec>],
        json: Option<&'a Value>,
        path: &'a str,
        len: usize,
    ) -> Self {
        Self {
            costs,
            json,
            path,
            len,
            cap: AtomicU64::new(u64::MAX),
            edits: OnceLock::new(),
        }
    }

    /// What `r` reserves of the request, when it is charged by an LLM's
    /// usage.
    pub(crate) fn of(&self, r: &PolicyRule) -> Option<u64> {
        let cost = llm_cost(self.costs, r.rule.name())?;
        let dialect = llm::dialect_of(cost.dialect, self.path);
        let _ = self
            .edits
            .get_or_init(|| dialect.map(|d| (d, cost.include_usage)));
        let asked = self.json.map(|v| {
            let mut a = llm::asked(dialect, v, self.len);
            a.capped_to(self.cap());
            a
        });
        Some(llm::reservation(cost, asked.as_ref()))
    }

    fn cap(&self) -> Option<u64> {
        let per = self.cap.load(Ordering::Relaxed);
        (per != u64::MAX).then_some(per)
    }

    /// `cap_max_output`, after a peek `d` that refused the request: the
    /// output a choice may ask for so that it fits every capping rule that
    /// refused it, kept for the decision that follows. Whether there is
    /// one (not when a rule that does not cap refused it, or when no
    /// output fits).
    pub(crate) fn fit(&self, d: &Decision) -> bool {
        let Some(v) = self.json else {
            return false;
        };
        let mut per = None::<u64>;
        for r in d.rules.iter().filter(|r| !r.allowed()) {
            let Some(cost) = llm_cost(self.costs, r.rule.name()).filter(|c| c.cap_max_output)
            else {
                return false;
            };
            let dialect = llm::dialect_of(cost.dialect, self.path);
            let asked = llm::asked(dialect, v, self.len);
            let Some(this) = llm::capped(cost, &asked, r.remaining, dialect, v) else {
                return false;
            };
            per = Some(per.map_or(this, |p| p.min(this)));
        }
        match per {
            Some(p) => {
                self.cap.store(p, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// The body as it goes upstream, when the LLM rules' edits change it.
    pub(crate) fn edited(&self) -> Option<Vec<u8>> {
        let (v, (dialect, include_usage)) = (self.json?, self.edits.get().copied().flatten()?);
        let per_choice = self.cap();
        let usage = include_usage && dialect == Dialect::OpenAi && llm::streams(v);
        if per_choice.is_none() && !usage {
            return None;
        }
        let mut v = v.clone();
        llm::edit(&mut v, Some(dialect), per_choice, include_usage)
            .then(|| serde_json::to_vec(&v).ok())
            .flatten()
    }
}

/// A rule's `from: llm` cost, if it has one.
fn llm_cost<'c>(costs: &'c [Arc<CostSpec>], rule: &str) -> Option<&'c LlmCost> {
    match &costs.iter().find(|c| c.rule == rule)?.source {
        CostSource::Llm(cost) => Some(cost),
        _ => None,
    }
}
