// require('sendNotify'): a message from a running ql3 task to its project's channels.
//
// QingLong's sendNotify(text, desp) call, backed by ql3's outbox: the message goes to the channels
// whose rules take `script` messages (docs/notifications.md "From a script"). Node's own http/https
// only. The credential is the run's own $QL3_NOTIFY_TOKEN, valid while the run runs; the server is
// $QL3_NOTIFY_URL. Resolves with the server's answer ({run_id, deliveries}); rejects when refused.
'use strict';

const RETRY_FOR_MS = 15000; // a run starts before its credential is accepted: 409 attempt_not_running

function post(url, token, body) {
  const target = new URL(url.replace(/\/+$/, '') + '/api/v1/notify');
  const client = target.protocol === 'https:' ? require('https') : require('http');
  const data = Buffer.from(JSON.stringify(body));
  return new Promise((resolve) => {
    const req = client.request(
      target,
      {
        method: 'POST',
        timeout: 10000,
        headers: {
          'Content-Type': 'application/json',
          'Content-Length': data.length,
          Authorization: 'Bearer ' + token,
        },
      },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => {
          let parsed = null;
          try {
            parsed = JSON.parse(Buffer.concat(chunks).toString('utf8'));
          } catch (e) {
            parsed = null;
          }
          resolve({ status: res.statusCode, body: parsed });
        });
      },
    );
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', (e) => resolve({ status: 0, body: { error: { code: 'unreachable', message: String(e) } } }));
    req.end(data);
  });
}

// params.log_lines (0-50): add the run's last lines of output, secrets masked.
async function sendNotify(text, desp = '', params = {}) {
  const url = process.env.QL3_NOTIFY_URL;
  const token = process.env.QL3_NOTIFY_TOKEN;
  if (!url || !token) {
    throw new Error('not_in_a_run: QL3_NOTIFY_URL and QL3_NOTIFY_TOKEN are set only inside a ql3 run');
  }
  const deadline = Date.now() + RETRY_FOR_MS;
  let delay = 100;
  for (;;) {
    const { status, body } = await post(url, token, { title: String(text), body: String(desp), log_lines: Number((params && params.log_lines) || 0) });
    if (status >= 200 && status < 300) return body;
    const error = (body && body.error) || { code: 'http_' + status, message: '' };
    const retry = error.code === 'attempt_not_running' || error.code === 'unreachable';
    if (!retry || Date.now() >= deadline) {
      const failure = new Error(error.code + ': ' + error.message);
      failure.code = error.code;
      throw failure;
    }
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(1000, delay * 2);
  }
}

module.exports = { sendNotify };
