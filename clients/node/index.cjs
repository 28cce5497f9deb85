// A client for the ratewarden gateway's decision API (`/v1/check`,
// `/v1/report`, `/v1/explain` on its admin listener), and Express
// middleware. The gateway decides, so a limit is exact across every process
// and machine that asks it. A gateway that does not answer within `timeout`
// never throws into a handler: the decision follows `onError` ("allow" or
// "deny") and the failure is logged.

// The one implementation, in CommonJS: `index.js` re-exports it to ES
// modules, so `import` and `require` share one `RatewardenError` (an error
// thrown by one passes `instanceof` from the other).
'use strict';

class RatewardenError extends Error {}

function unanswered(onError, why, log) {
  log(`ratewarden: the gateway gave no decision (${why}); onError=${onError}`);
  return { allowed: onError !== 'deny', unanswered: true, headers: {}, rules: [], retryAfter: null };
}

function decision(v) {
  return {
    allowed: Boolean(v.allowed),
    retryAfter: v.retry_after ?? null,
    remaining: v.remaining ?? null,
    limit: v.limit ?? null,
    resetAfter: v.reset_after ?? null,
    rule: v.rule ?? null,
    reason: v.reason ?? null,
    lease: v.lease ?? null,
    headers: v.headers ?? {},
    rules: v.rules ?? [],
    status: v.status ?? null,
    problem: v.problem ?? null,
    unanswered: false,
  };
}

/** What an answer's `status` settles for a `count: failures` rule's part. */
function settleOutcome(part, status) {
  if (part.count !== 'failures' || status === 429) return null;
  const ranges = part.failure_status ?? [[400, 428], [430, 499]];
  if (ranges.some(([lo, hi]) => lo <= status && status <= hi)) return 'failure';
  if (status >= 200 && status < 300) return 'success';
  return null;
}

function createClient({ url, token, timeout = 250, onError = 'allow', log = console.warn } = {}) {
  if (!url) throw new RatewardenError('createClient needs the admin listener\'s url');
  if (onError !== 'allow' && onError !== 'deny') throw new RatewardenError('onError is "allow" or "deny"');
  const base = url.replace(/\/+$/, '');
  const headers = { 'content-type': 'application/json', accept: 'application/json' };
  if (token) headers.authorization = `Bearer ${token}`;

  async function call(method, path, body) {
    const r = await fetch(base + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(timeout),
    });
    if (r.status === 401) {
      throw new RatewardenError('the gateway refused the admin token (401): set `token` to its admin.token');
    }
    let v = null;
    try { v = await r.json(); } catch { v = null; }
    return [r.status, v];
  }

  async function decide(body) {
    let status, v;
    try {
      [status, v] = await call('POST', '/v1/check', body);
    } catch (e) {
      return unanswered(onError, `${e.name}: ${e.message}`, log);
    }
    if (status >= 500 || v === null) return unanswered(onError, `the gateway answered ${status}`, log);
    if (status !== 200) return { ...decision({}), allowed: false, status, problem: v };
    return decision(v);
  }

  async function report(rule, key, fields = {}) {
    const body = { rule, key: String(key) };
    for (const [k, x] of Object.entries(fields)) if (x !== undefined && x !== null) body[k] = x;
    try {
      const [status, v] = await call('POST', '/v1/report', body);
      if (status !== 200) { log(`ratewarden: a report to ${rule} was refused (${status})`); return null; }
      return v;
    } catch (e) {
      log(`ratewarden: a report to ${rule} was not delivered: ${e.message}`);
      return null;
    }
  }

  const client = {
    async ping() {
      let status;
      try { [status] = await call('GET', '/v1/rules'); } catch (e) {
        if (e instanceof RatewardenError) throw e;
        throw new RatewardenError(`the gateway at ${base} does not answer: ${e.message}`);
      }
      if (status !== 200) throw new RatewardenError(`the gateway answered ${status} to GET /v1/rules`);
    },
    check(rule, key, { cost = 1, identity } = {}) {
      const body = { rule, key: String(key), cost };
      if (identity !== undefined) body.identity = identity;
      return decide(body);
    },
    checkRequest({ method = 'GET', path = '/', headers: h, peer, identity, host, query, body, cost } = {}) {
      const request = { method, path };
      for (const [k, x] of Object.entries({ headers: h, peer, identity, host, query, body })) {
        if (x !== undefined && x !== null) request[k] = x;
      }
      const b = { request };
      if (cost !== undefined) b.cost = cost;
      return decide(b);
    },
    report,
    async settle(d, status) {
      for (const part of d.rules) {
        const outcome = settleOutcome(part, status);
        if (outcome) await report(part.rule, part.key, { outcome });
      }
      await client.release(d);
    },
    async release(d) {
      for (const part of d.rules) {
        if (part.lease !== null && part.lease !== undefined) await report(part.rule, part.key, { lease: part.lease });
      }
    },
    async explain(params = {}) {
      const [status, v] = await call('GET', '/v1/explain?' + new URLSearchParams(params));
      if (status !== 200) throw new RatewardenError(`explain answered ${status}`);
      return v;
    },
  };
  return client;
}

/**
 * Express middleware (Express 4 and 5). With `rule`, charges that rule on
 * `key(req)` (default: the client's address); with `request: true`, decides
 * the request as the gateway's proxy would. A refusal is answered with the
 * gateway's status, rate-limit headers and problem body; an admitted
 * request's `count: failures` rules are settled on `res`'s `finish`, and its
 * `concurrency` slots given back on `close` (a client that left too).
 */
function rateLimit({ client, rule, request = false, key } = {}) {
  if (!client) throw new RatewardenError('rateLimit needs a client (createClient)');
  if (!rule && !request) throw new RatewardenError('rateLimit needs a rule, or request: true');
  const keyOf = key ?? ((req) => req.ip ?? req.socket.remoteAddress);
  return async function ratewardenMiddleware(req, res, next) {
    let d;
    try {
      d = request
        ? await client.checkRequest({
          method: req.method,
          path: (req.originalUrl ?? req.url).split('?')[0],
          headers: Object.fromEntries(Object.entries(req.headers).map(([k, v]) => [k, Array.isArray(v) ? v.join(', ') : String(v)])),
          peer: req.socket.remoteAddress,
          query: (req.originalUrl ?? req.url).split('?')[1],
        })
        : await client.check(rule, keyOf(req));
    } catch (e) {
      return next(e);
    }
    for (const [k, v] of Object.entries(d.headers)) res.setHeader(k, v);
    if (!d.allowed) {
      if (d.retryAfter !== null && d.retryAfter !== undefined) res.setHeader('retry-after', String(Math.max(1, Math.ceil(d.retryAfter))));
      const status = d.status ?? (d.unanswered ? 503 : 429);
      const by = d.rules.find((r) => !r.allowed);
      const problem = d.problem ?? {
        type: 'about:blank', title: 'Too Many Requests', status,
        ...(by ? { detail: `rate limit '${by.rule}' exceeded` } : {}),
        ...(d.retryAfter != null ? { retry_after: d.retryAfter } : {}),
      };
      res.status(status).type('application/problem+json').send(JSON.stringify(problem));
      return;
    }
    if (!d.unanswered && d.rules.length) {
      let finished = false;
      res.on('finish', () => { finished = true; client.settle(d, res.statusCode); });
      res.on('close', () => { if (!finished) client.release(d); });
    }
    next();
  };
}

module.exports = { createClient, rateLimit, settleOutcome, RatewardenError };
