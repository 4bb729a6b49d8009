// Read-only tools the platform gave this run (KER-5).
//
//   const tools = require('./corral_tools');
//   await tools.available();                       // the tools this run may call
//   await tools.call('docs.search', { query: 'q' }); // the tool's bounded answer
//
// The worker's supervisor holds the capability and forwards each call; this module never sees
// it. A refused or failed call rejects with an Error whose `code` is stable.
'use strict';
const http = require('http');

const PORT = 8099;

function request(method, path, body) {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? '' : JSON.stringify(body);
    const req = http.request({ host: '127.0.0.1', port: PORT, method, path,
      headers: { 'Content-Type': 'application/json',
                 'Content-Length': Buffer.byteLength(payload) } }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        let reply = null;
        try { reply = JSON.parse(Buffer.concat(chunks).toString('utf8') || 'null'); } catch (e) {}
        if (res.statusCode !== 200) {
          const error = (reply && reply.error) || {};
          const failure = new Error((error.code || 'tool_failed') + ': ' + (error.message || ''));
          failure.code = error.code || 'tool_failed';
          reject(failure);
        } else {
          resolve(reply);
        }
      });
    });
    req.on('error', (e) => {
      const failure = new Error('tool_unavailable: this run was given no tools (' + e.message + ')');
      failure.code = 'tool_unavailable';
      reject(failure);
    });
    req.end(payload);
  });
}

exports.available = async () => (await request('GET', '/tools')).tools;
exports.call = async (tool, args) =>
  (await request('POST', '/call', { tool, arguments: args || {} })).result;
