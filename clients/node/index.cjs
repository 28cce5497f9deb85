// CommonJS entry: the same client, loaded from the ES module (Node >= 18
// `require`s it through a dynamic import made once).
'use strict';
let loaded;
const load = () => (loaded ??= import('./index.js'));
class RatewardenError extends Error {}
function createClient(options) {
  let real;
  const ready = load().then((m) => { real = m.createClient(options); return real; });
  const forward = (name) => async (...args) => (real ?? await ready)[name](...args);
  return {
    ping: forward('ping'), check: forward('check'), checkRequest: forward('checkRequest'),
    report: forward('report'), settle: forward('settle'), release: forward('release'), explain: forward('explain'),
  };
}
function rateLimit(options) {
  let real;
  const ready = load().then((m) => { real = m.rateLimit(options); return real; });
  return (req, res, next) => (real ? real(req, res, next) : ready.then((mw) => mw(req, res, next), next));
}
module.exports = { createClient, rateLimit, RatewardenError };
