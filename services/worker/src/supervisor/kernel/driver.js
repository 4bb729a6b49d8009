// A persistent Node cell (KER-1 to KER-3, decision 0016): restore the previous cell's variables
// as globals, run the cell as a script in the global scope, and checkpoint when the process
// exits (after its timers and promises), with v8.serialize: one serialization over every value,
// so that shared references, cycles, Map, Set, Date, BigInt and typed arrays survive. Functions
// and classes are kept by their source text. The supervisor has already checked the checkpoint's
// structure, seal and runtime; this restores all of it or nothing.
function corralKernel(params) {
  const fs = require('fs'), v8 = require('v8'), vm = require('vm');
  const crypto = require('crypto'), path = require('path');
  const p = JSON.parse(Buffer.from(params, 'base64').toString('utf8'));
  const fail = (message) => {
    fs.writeSync(2, 'corral kernel: ' + message + '\n');
    process.exit(1);
  };
  // What the cell may use as a CommonJS program would, and what is not the cell's to keep.
  const given = {
    require, module, exports: module.exports, __filename: p.filename,
    __dirname: path.dirname(p.filename),
  };
  Object.assign(globalThis, given);
  const baseline = new Set(Object.getOwnPropertyNames(globalThis));
  const restored = [];
  if (fs.existsSync(p.checkpoint)) {
    let state;
    try {
      const data = fs.readFileSync(p.checkpoint);
      const first = data.indexOf(10), second = data.indexOf(10, first + 1);
      state = v8.deserialize(data.subarray(second + 1));
      const functions = {};
      for (const [name, source] of Object.entries(state.functions)) {
        functions[name] = vm.runInThisContext('(' + source + ')');
      }
      Object.assign(state.values, functions);
    } catch (e) {
      fail('the checkpoint could not be restored (' + String(e).slice(0, 200) +
        '); nothing was restored and the cell did not run');
    }
    for (const [name, value] of Object.entries(state.values)) {
      globalThis[name] = value;
      baseline.delete(name);
      restored.push(name);
    }
  }
  // The kernel's state object (the specification's): kept as any global is.
  if (!Object.prototype.hasOwnProperty.call(globalThis, 'state')) {
    globalThis.state = {};
    baseline.delete('state');
  }
  let lexical = () => [];
  try {
    const inspector = require('inspector');
    const session = new inspector.Session();
    session.connect();
    lexical = () => {
      let names = [];
      session.post('Runtime.globalLexicalScopeNames', {}, (error, reply) => {
        if (!error) names = reply.names;
      });
      return names;
    };
  } catch (e) {
    // Without the inspector, let, const and class bindings are not seen; var and function are.
  }
  process.on('exit', () => checkpoint(p, baseline, lexical, given));
  try {
    vm.runInThisContext(p.cell, { filename: p.filename });
  } catch (e) {
    // As an uncaught exception ends a program, without the driver's frames; the checkpoint is
    // written on the way out.
    const stack = e instanceof Error && typeof e.stack === 'string' ? e.stack : String(e);
    const cut = stack.indexOf('\n    at Script.runInThisContext');
    fs.writeSync(2, (cut < 0 ? stack : stack.slice(0, cut)) + '\n');
    process.exit(1);
  }
}

function checkpoint(p, baseline, lexical, given) {
  const fs = require('fs'), v8 = require('v8'), vm = require('vm');
  const crypto = require('crypto'), path = require('path');
  const limit = p.reason_max;
  const names = Object.getOwnPropertyNames(globalThis).filter(
    (n) => !baseline.has(n) && !(n in given));
  for (const n of lexical()) {
    if (!names.includes(n)) names.push(n);
  }
  const values = {}, functions = {}, notKept = [];
  const never = (v) => {
    const kind = (m, c) => {
      try { return v instanceof require(m)[c]; } catch (e) { return false; }
    };
    if (kind('net', 'Socket') || kind('dgram', 'Socket')) return 'a socket';
    if (kind('worker_threads', 'Worker')) return 'a thread';
    if (kind('child_process', 'ChildProcess')) return 'a process handle';
    if (kind('fs', 'ReadStream') || kind('fs', 'WriteStream')) return 'an open file';
    if (kind('stream', 'Stream')) return 'a stream (an open handle)';
    if (kind('net', 'Server') || kind('http', 'Server')) return 'a server (a socket)';
    if (kind('events', 'EventEmitter')) return 'an event emitter (live handles)';
    const constructor = v && v.constructor && v.constructor.name;
    if (constructor === 'Timeout' || constructor === 'Immediate') return 'a timer';
    if (v instanceof Promise) return 'a promise (pending work)';
    if (v instanceof WeakMap || v instanceof WeakSet || v instanceof WeakRef) return 'a weak reference';
    return null;
  };
  // The first handle a value holds, within a bounded walk.
  const held = (root) => {
    const seen = new Set(), queue = [root];
    let looked = 0;
    while (queue.length > 0 && looked < 100000) {
      const v = queue.pop();
      looked += 1;
      if (v === null || (typeof v !== 'object' && typeof v !== 'function') || seen.has(v)) continue;
      seen.add(v);
      if (ArrayBuffer.isView(v) || v instanceof ArrayBuffer) continue;
      const why = never(v);
      if (why) return v === root ? why : 'holds ' + why;
      if (typeof v === 'function') return v === root ? null : 'holds a function';
      const children = v instanceof Map ? [...v.keys(), ...v.values()]
        : v instanceof Set ? [...v] : Object.values(v);
      queue.push(...children);
    }
    return null;
  };
  for (const n of names) {
    let v;
    try { v = vm.runInThisContext(n); } catch (e) { continue; }
    const why = held(v);
    if (why) { notKept.push({ name: n, reason: why }); continue; }
    if (typeof v === 'function') {
      const source = Function.prototype.toString.call(v);
      try {
        new vm.Script('(' + source + ')');
        if (/\{ \[native code\] \}$/.test(source)) throw new Error('native');
        functions[n] = source;
      } catch (e) {
        notKept.push({ name: n, reason: 'a function whose source cannot be re-created' });
      }
      continue;
    }
    if (typeof v === 'symbol') { notKept.push({ name: n, reason: 'a symbol' }); continue; }
    values[n] = v;
  }
  const serialize = (state) => {
    const data = v8.serialize(state);
    v8.deserialize(data);
    return data;
  };
  let payload;
  try {
    payload = serialize({ values, functions });
  } catch (e) {
    // One serialization over every value keeps shared references and cycles; the values that
    // fail are found one by one, reported by name, and the rest serialized together again.
    for (const n of Object.keys(values)) {
      try { serialize(values[n]); } catch (e) {
        notKept.push({ name: n, reason: ('not serializable: ' + String(e.message || e)).slice(0, limit) });
        delete values[n];
      }
    }
    try {
      payload = serialize({ values, functions });
    } catch (e) {
      for (const n of Object.keys(values)) notKept.push({ name: n, reason: 'not kept with the others' });
      payload = serialize({ values: {}, functions });
    }
  }
  const header = {
    language: 'node', runtime: p.runtime, nonce: p.nonce, payload_bytes: payload.length,
    payload_sha256: crypto.createHash('sha256').update(payload).digest('hex'),
    kept: [...Object.keys(values), ...Object.keys(functions)], not_kept: notKept,
  };
  const temporary = p.checkpoint + '.tmp';
  try {
    fs.mkdirSync(path.dirname(p.checkpoint), { recursive: true });
    fs.writeFileSync(temporary, Buffer.concat([
      Buffer.from(p.magic + '\n' + JSON.stringify(header) + '\n'), payload]));
    fs.renameSync(temporary, p.checkpoint);
  } catch (e) {
    // The workspace is full or unwritable: the previous checkpoint stays authoritative.
    // A full workspace is left full, so that the run reports SANDBOX_WORKSPACE_MAX_BYTES (and
    // its workspace is not kept); anything else leaves no partial file behind.
    if (e.code !== 'ENOSPC') {
      try { fs.unlinkSync(temporary); } catch (ignored) { /* never written */ }
    }
    fs.writeSync(2, 'corral kernel: the checkpoint was not written (' + (e.code || e.message) +
      '); the previous one stays\n');
    if (!process.exitCode) process.exitCode = 1;
  }
}
