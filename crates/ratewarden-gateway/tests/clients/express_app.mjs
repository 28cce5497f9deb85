// An Express app for tests/clients.rs: `GET /hot` charged to one key
// through the `ratewarden` package's middleware; prints `port=N`.
import express from 'express';
import { createClient, rateLimit } from 'ratewarden';

const client = createClient({ url: process.env.RATEWARDEN_URL, timeout: 1000 });
const app = express();
app.get('/hot', rateLimit({ client, rule: 'hot', key: () => 'one-key' }), (req, res) => {
  res.json({ ok: true });
});
const server = app.listen(0, '127.0.0.1', () => {
  console.log(`port=${server.address().port}`);
});
