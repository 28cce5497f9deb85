//! The keys of a rule held in Redis, by a bounded `SCAN` of every server
//! (every master of a cluster): for `/v1/keys` and `/v1/bans`.

use super::*;
use crate::store::shared::Scanned;

/// How many names one `SCAN` step examines (its `COUNT`).
pub const SCAN_COUNT: usize = 1000;

/// The masters' addresses in a `CLUSTER SLOTS` reply: each range's first
/// node is its master.
pub(super) fn masters(slots: &redis::Value) -> Result<Vec<(String, u16)>, StoreError> {
    let bad = || StoreError::Protocol("CLUSTER SLOTS: unexpected reply".into());
    let redis::Value::Array(ranges) = slots else {
        return Err(bad());
    };
    let mut out: Vec<(String, u16)> = vec![];
    for range in ranges {
        let redis::Value::Array(parts) = range else {
            return Err(bad());
        };
        let Some(redis::Value::Array(node)) = parts.get(2) else {
            return Err(bad());
        };
        let (Some(host), Some(port)) = (node.first(), node.get(1)) else {
            return Err(bad());
        };
        let host: String = redis::from_redis_value_ref(host).map_err(|_| bad())?;
        let port: u16 = redis::from_redis_value_ref(port).map_err(|_| bad())?;
        if !out.iter().any(|(h, p)| *h == host && *p == port) {
            out.push((host, port));
        }
    }
    Ok(out)
}

impl RedisStore {
    /// The keys of `rule` held in Redis, by a bounded `SCAN`: on each
    /// server (every master of a cluster) at most `budget` names are
    /// examined, `COUNT` [`SCAN_COUNT`] at a time, each step a call of its
    /// own under the timeout and the breaker. `(group, key)` pairs, as
    /// [`Op::grouped`] takes them. Only strings are listed: every stored
    /// state is one (`store` in `lua/rule.lua`), and a key's zset (`:log`)
    /// would otherwise read as another key.
    pub(super) async fn scan_keys(
        &self,
        rule: &crate::Rule,
        budget: usize,
    ) -> Result<Scanned, StoreError> {
        let prefix = &self.inner.config.key_prefix;
        let pattern = keys::pattern(prefix, rule.id());
        let nodes = match self.guarded(self.conn()).await? {
            Conn::Single(_) => vec![None],
            Conn::Cluster(mut c) => {
                let slots = self
                    .guarded(async {
                        redis::cmd("CLUSTER")
                            .arg("SLOTS")
                            .query_async::<redis::Value>(&mut c)
                            .await
                            .map_err(classify)
                    })
                    .await?;
                masters(&slots)?.into_iter().map(Some).collect()
            }
        };
        let mut out = Scanned {
            keys: vec![],
            complete: true,
        };
        let mut seen = std::collections::HashSet::new();
        for node in nodes {
            let (mut cursor, mut examined) = (0u64, 0usize);
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .arg("TYPE")
                    .arg("string");
                let (next, names): (u64, Vec<String>) = self
                    .guarded(async {
                        match (self.conn().await?, &node) {
                            (Conn::Single(mut c), _) => cmd.query_async(&mut c).await,
                            (Conn::Cluster(mut c), Some((host, port))) => {
                                let routing = redis::cluster_routing::RoutingInfo::SingleNode(
                                    redis::cluster_routing::SingleNodeRoutingInfo::ByAddress {
                                        host: host.clone(),
                                        port: *port,
                                    },
                                );
                                c.route_command(cmd, routing)
                                    .await
                                    .and_then(|v| Ok(redis::from_redis_value(v)?))
                            }
                            (Conn::Cluster(_), None) => {
                                return Err(StoreError::Protocol("no cluster node".into()));
                            }
                        }
                        .map_err(classify)
                    })
                    .await?;
                for name in &names {
                    if let Some(found) = keys::parse(prefix, rule.id(), name)
                        && seen.insert(found.clone())
                    {
                        out.keys.push(found);
                    }
                }
                examined += SCAN_COUNT;
                cursor = next;
                if cursor == 0 {
                    break;
                }
                if examined >= budget {
                    out.complete = false;
                    break;
                }
            }
        }
        Ok(out)
    }
}
