// Corral's TypeScript client: fetch only (Node 20 and browsers), typed answers, a typed error per
// refusal carrying the API's stable code and Retry-After, and the request's timeout kept apart
// from a stream's (`requestTimeoutMs`, `streamIdleTimeoutMs`).

/** One bounded output stream of a run. */
export interface Output {
  text: string;
  truncated: boolean;
  bytes_total: number;
  bytes_dropped: number;
}

/** Why a run did not succeed, in band: its stable code, a message, and what the code adds. */
export interface RunError {
  code: string;
  message: string;
  [detail: string]: unknown;
}

/** A run's answer. `outcome`: succeeded, failed, bound_exceeded, not_run or error. */
export interface RunResult {
  runId: string;
  outcome: string;
  exitCode: number | null;
  stdout: Output;
  stderr: Output;
  error: RunError | null;
  /** Rich results, as a notebook shows them: the last expression's value and the figures left
   * open, each by media type (`text/plain`, `text/html`, `image/png` in base64). */
  results: Array<Record<string, string>>;
  body: Record<string, unknown>;
}

/** The fields of a run answer's `model` that `RunResult` reads; the tests check each against the
 * API's `/openapi.json`. */
export const RUN_MODEL_FIELDS = ["exit_code", "stdout", "stderr", "results"] as const;

/** One event of a streamed run, with when this client received it (`performance.now()`). */
export interface RunEvent {
  name: string;
  id: string | null;
  data: Record<string, unknown>;
  receivedAt: number;
}

/** An admitted Pi package (PI-1). */
export interface Validation {
  validationId: string;
  profile: string;
  runtimeVersion: string | null;
  surface: Record<string, string[]>;
  durations: Record<string, number>;
  body: Record<string, unknown>;
}

export interface RunOptions {
  packages?: string[];
  kernel?: "ephemeral" | "persistent";
  declared_outputs?: string[];
  wait_seconds?: number;
  /** Streams the run and gives each event to this callback as it arrives. */
  onEvent?: (event: RunEvent) => void;
  /** Streams the run and gives each chunk of its stdout to this callback as the code writes it. */
  onStdout?: (text: string) => void;
  /** Streams the run and gives each chunk of its stderr to this callback as the code writes it. */
  onStderr?: (text: string) => void;
}

export interface ClientOptions {
  baseUrl: string;
  token: string;
  actor: string;
  conversation: string;
  member?: string;
  adminToken?: string;
  /** The longest a request that does not stream may take to be answered. */
  requestTimeoutMs?: number;
  /** The longest a streamed run may go without an event. */
  streamIdleTimeoutMs?: number;
  /** How many times a broken stream is resumed (`Last-Event-ID`) before it is given up (3). */
  resumeAttempts?: number;
  fetch?: typeof fetch;
}

/** A refusal: the API's stable `code`, the HTTP `status`, `retryAfter` seconds when given. */
export class CorralError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly status: number,
    readonly retryAfter: number | null,
    readonly body: Record<string, unknown>,
  ) {
    super(`${code}: ${message}`);
    this.name = new.target.name;
  }

  /** The answer's `error` object. */
  get error(): Record<string, unknown> {
    const error = this.body["error"];
    return error && typeof error === "object" ? (error as Record<string, unknown>) : {};
  }
}
/** Refused before anything ran (400, 413, 422). */
export class InvalidRequest extends CorralError {}
/** No credential, or the wrong one (401). */
export class Unauthorized extends CorralError {}
/** Something the request needs is held by another operation (409). */
export class Busy extends CorralError {}
/** No worker within the wait, a full queue, coordination unavailable (429, 503): see retryAfter. */
export class CapacityUnavailable extends CorralError {}
/** The worker stopped answering (502). */
export class WorkerLost extends CorralError {}
/** A package validation failed closed: `step`, `drift` and `tail` in `error`. */
export class PackageRejected extends CorralError {}
/** A request got no answer within `requestTimeoutMs`. */
export class RequestTimeout extends CorralError {}
/** A stream went `streamIdleTimeoutMs` without an event (the run goes on at the API). */
export class StreamTimeout extends CorralError {}

/** The typed error of an answer. */
export function errorFor(status: number, body: unknown, retryAfter: string | null): CorralError {
  const answer = body && typeof body === "object" ? (body as Record<string, unknown>) : {};
  const error = (answer["error"] && typeof answer["error"] === "object" ? answer["error"] : {}) as Record<string, unknown>;
  const code = typeof error["code"] === "string" ? error["code"] : `http_${status}`;
  const message = typeof error["message"] === "string" ? error["message"] : "";
  let seconds = retryAfter === null ? NaN : Number(retryAfter);
  if (Number.isNaN(seconds) && typeof error["retry_after_seconds"] === "number") seconds = error["retry_after_seconds"];
  const retry = Number.isNaN(seconds) ? null : seconds;
  const Kind =
    code.startsWith("package_") || code === "pi_runtime_unavailable"
      ? PackageRejected
      : status === 401
        ? Unauthorized
        : status === 409
          ? Busy
          : status === 429 || status === 503
            ? CapacityUnavailable
            : status === 502
              ? WorkerLost
              : InvalidRequest;
  return new Kind(code, message, status, retry, answer);
}

function output(value: unknown): Output {
  const o = (value && typeof value === "object" ? value : {}) as Partial<Output>;
  return { text: o.text ?? "", truncated: o.truncated ?? false, bytes_total: o.bytes_total ?? 0, bytes_dropped: o.bytes_dropped ?? 0 };
}

/** A run's answer, typed. */
export function runResultOf(body: Record<string, unknown>): RunResult {
  const model = (body["model"] ?? {}) as Record<string, unknown>;
  return {
    runId: String(body["run_id"] ?? ""),
    outcome: String(body["outcome"] ?? ""),
    exitCode: (model["exit_code"] as number | null | undefined) ?? null,
    stdout: output(model["stdout"]),
    stderr: output(model["stderr"]),
    error: (body["error"] as RunError | null | undefined) ?? null,
    results: (model["results"] as Array<Record<string, string>> | undefined) ?? [],
    body,
  };
}

/** Server-sent events, fed chunk by chunk. */
class EventParser {
  private buffer = "";
  private name = "message";
  private id: string | null = null;
  private data: string[] = [];

  feed(chunk: string): Array<[string | null, string, string]> {
    this.buffer += chunk;
    const done: Array<[string | null, string, string]> = [];
    let newline: number;
    while ((newline = this.buffer.indexOf("\n")) >= 0) {
      const line = this.buffer.slice(0, newline).replace(/\r$/, "");
      this.buffer = this.buffer.slice(newline + 1);
      if (line === "") {
        if (this.data.length > 0) done.push([this.id, this.name, this.data.join("\n")]);
        this.name = "message";
        this.id = null;
        this.data = [];
      } else if (line.startsWith("event:")) this.name = line.slice(6).trim();
      else if (line.startsWith("data:")) this.data.push(line.slice(5).replace(/^ /, ""));
      else if (line.startsWith("id:")) this.id = line.slice(3).trim();
    }
    return done;
  }
}

export class Client {
  private readonly base: string;
  private readonly identity: { actor: string; conversation: string; member: string };
  private readonly fetch: typeof fetch;
  readonly requestTimeoutMs: number;
  readonly streamIdleTimeoutMs: number;
  readonly resumeAttempts: number;

  constructor(private readonly options: ClientOptions) {
    this.base = options.baseUrl.replace(/\/+$/, "");
    this.identity = { actor: options.actor, conversation: options.conversation, member: options.member ?? options.actor };
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.requestTimeoutMs = options.requestTimeoutMs ?? 300_000;
    this.streamIdleTimeoutMs = options.streamIdleTimeoutMs ?? 120_000;
    this.resumeAttempts = options.resumeAttempts ?? 3;
  }

  private async request(method: string, path: string, body?: unknown, token = this.options.token): Promise<Record<string, unknown>> {
    let response: Response;
    try {
      response = await this.fetch(`${this.base}${path}`, {
        method,
        headers: { Authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(this.requestTimeoutMs),
      });
    } catch (e) {
      if (e instanceof Error && (e.name === "TimeoutError" || e.name === "AbortError")) {
        throw new RequestTimeout("request_timeout", `no answer within ${this.requestTimeoutMs} ms`, 0, null, {});
      }
      throw e;
    }
    const text = await response.text();
    let answer: Record<string, unknown>;
    try {
      answer = JSON.parse(text) as Record<string, unknown>;
    } catch {
      answer = { error: { code: `http_${response.status}`, message: text.slice(0, 500) } };
    }
    if (response.status >= 400) throw errorFor(response.status, answer, response.headers.get("retry-after"));
    return answer;
  }

  /** Runs `code`: a run that did not succeed is a result; a refusal throws its typed error. With
   * `onEvent`, `onStdout` or `onStderr` the run is streamed, and a dropped connection resumed. */
  async runCode(code: string, language = "python", options: RunOptions = {}): Promise<RunResult> {
    const { onEvent, onStdout, onStderr, ...rest } = options;
    const body = { ...this.identity, language, code, ...rest };
    if (!onEvent && !onStdout && !onStderr) return runResultOf(await this.request("POST", "/v1/run_code", body));
    let result: RunResult | null = null;
    for await (const event of this.streamBody(body)) {
      onEvent?.(event);
      if (event.name === "run.output") {
        const tell = event.data["stream"] === "stdout" ? onStdout : onStderr;
        tell?.(String(event.data["text"] ?? ""));
      }
      if (event.name === "run.result") {
        const status = Number(event.data["status"] ?? 0);
        const answer = (event.data["body"] ?? {}) as Record<string, unknown>;
        if (status >= 400) throw errorFor(status, answer, null);
        result = runResultOf(answer);
      }
    }
    if (!result) throw new StreamTimeout("stream_ended", "the stream ended before the run's result", 0, null, {});
    return result;
  }

  /** The run's events as they arrive; the last is `run.result`. A dropped connection is resumed
   * (up to `resumeAttempts` times) from the last event received. */
  async *streamCode(
    code: string,
    language = "python",
    options: Omit<RunOptions, "onEvent" | "onStdout" | "onStderr"> = {},
  ): AsyncGenerator<RunEvent> {
    yield* this.streamBody({ ...this.identity, language, code, ...options });
  }

  /** A streamed run's events after `lastEventId` (all of them without one), from this client's
   * API replica whichever ran it: the rest of a stream another connection lost, nothing twice. */
  async *resume(runId: string, lastEventId: string | null = null): AsyncGenerator<RunEvent> {
    let last = lastEventId;
    for (let attempt = 0; ; attempt++) {
      try {
        for await (const event of this.resumeOnce(runId, last)) {
          last = event.id ?? last;
          yield event;
          if (event.name === "run.result") return;
        }
        return;
      } catch (e) {
        if (e instanceof CorralError || attempt >= this.resumeAttempts) throw e;
      }
    }
  }

  private resumeOnce(runId: string, lastEventId: string | null): AsyncGenerator<RunEvent> {
    const query = new URLSearchParams({ actor: this.identity.actor, conversation: this.identity.conversation });
    const headers: Record<string, string> = lastEventId === null ? {} : { "Last-Event-ID": lastEventId };
    return this.events("GET", `/v1/runs/${encodeURIComponent(runId)}/events?${query}`, undefined, headers);
  }

  private async *streamBody(body: unknown): AsyncGenerator<RunEvent> {
    let last: RunEvent | null = null;
    let runId: string | null = null;
    try {
      for await (const event of this.events("POST", "/v1/run_code", body)) {
        last = event;
        runId ??= (event.data["run_id"] as string | undefined) ??
          ((event.data["body"] as Record<string, unknown> | undefined)?.["run_id"] as string | undefined) ?? null;
        yield event;
      }
      if (last?.name === "run.result") return;
    } catch (e) {
      // A refusal or an idle stream is the caller's; a broken connection is resumed.
      if (e instanceof CorralError || runId === null || last === null) throw e;
    }
    if (runId === null || last === null) return;
    yield* this.resume(runId, last.id);
  }

  private async *events(method: string, path: string, body?: unknown, extra: Record<string, string> = {}): AsyncGenerator<RunEvent> {
    const abort = new AbortController();
    let idle = setTimeout(() => abort.abort(), this.requestTimeoutMs);
    const response = await this.fetch(`${this.base}${path}`, {
      method,
      headers: {
        Authorization: `Bearer ${this.options.token}`,
        Accept: "text/event-stream",
        ...(body === undefined ? {} : { "Content-Type": "application/json" }),
        ...extra,
      },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: abort.signal,
    });
    if (response.status >= 400) {
      clearTimeout(idle);
      const text = await response.text();
      let answer: unknown = {};
      try { answer = JSON.parse(text); } catch { /* not JSON: the status says enough */ }
      throw errorFor(response.status, answer, response.headers.get("retry-after"));
    }
    const reader = response.body!.getReader();
    const decoder = new TextDecoder();
    const parser = new EventParser();
    try {
      for (;;) {
        clearTimeout(idle);
        idle = setTimeout(() => abort.abort(), this.streamIdleTimeoutMs);
        let chunk: ReadableStreamReadResult<Uint8Array>;
        try {
          chunk = await reader.read();
        } catch (e) {
          if (abort.signal.aborted) {
            throw new StreamTimeout("stream_idle_timeout", `no event within ${this.streamIdleTimeoutMs} ms`, 0, null, {});
          }
          throw e;
        }
        if (chunk.done) break;
        for (const [id, name, data] of parser.feed(decoder.decode(chunk.value, { stream: true }))) {
          yield { name, id, data: JSON.parse(data) as Record<string, unknown>, receivedAt: performance.now() };
        }
      }
      for (const [id, name, data] of parser.feed("\n\n")) {
        yield { name, id, data: JSON.parse(data) as Record<string, unknown>, receivedAt: performance.now() };
      }
    } finally {
      clearTimeout(idle);
      // A consumer that stopped early drops the connection; the run goes on at the API.
      abort.abort();
    }
  }

  /** A file of the workspace, by relative path. */
  async readFile(path: string): Promise<Uint8Array> {
    const query = new URLSearchParams({ actor: this.identity.actor, conversation: this.identity.conversation, path });
    const response = await this.fetch(`${this.base}/v1/read_workspace?${query}`, {
      headers: { Authorization: `Bearer ${this.options.token}` },
      signal: AbortSignal.timeout(this.requestTimeoutMs),
    });
    if (response.status >= 400) {
      throw errorFor(response.status, await response.json().catch(() => ({})), response.headers.get("retry-after"));
    }
    return new Uint8Array(await response.arrayBuffer());
  }

  /** A text file with its Hashline anchors (WS-3): `lines` as `LINE:TAG|text`. */
  async readHashline(path: string, start?: number, count?: number): Promise<{ tag: string; totalLines: number; lines: string[]; body: Record<string, unknown> }> {
    const query = new URLSearchParams({ actor: this.identity.actor, conversation: this.identity.conversation, path, view: "hashline" });
    if (start !== undefined) query.set("start", String(start));
    if (count !== undefined) query.set("count", String(count));
    const body = await this.request("GET", `/v1/read_workspace?${query}`);
    const lines = typeof body["lines"] === "string" ? (body["lines"] as string).split("\n").filter((l) => l !== "") : [];
    return { tag: String(body["tag"] ?? ""), totalLines: Number(body["total_lines"] ?? 0), lines, body };
  }

  /** Hashline edits (`{op, tag, line, end_line?, text?}`) to a workspace file. */
  async editFile(path: string, edits: Array<Record<string, unknown>>): Promise<Record<string, unknown>> {
    return this.request("POST", "/v1/edit_workspace", { actor: this.identity.actor, conversation: this.identity.conversation, path, edits });
  }

  /** The stored workspace: `{generation, files: [{path, kind, bytes}], bytes_total, bytes_max}`. */
  async listFiles(): Promise<Record<string, unknown>> {
    const query = new URLSearchParams({ actor: this.identity.actor, conversation: this.identity.conversation });
    return this.request("GET", `/v1/list_workspace?${query}`);
  }

  /** Creates a file (text, or bytes sent in base64) by the rules a run's save follows: never
   * replaces (`workspace_path_exists`), all or nothing; a text file's answer has its `hashline`. */
  async writeFile(path: string, content: string | Uint8Array): Promise<Record<string, unknown>> {
    const field = typeof content === "string" ? { text: content } : { base64: btoa(String.fromCharCode(...content)) };
    return this.request("POST", "/v1/write_workspace", { actor: this.identity.actor, conversation: this.identity.conversation, path, ...field });
  }

  /** Validates an authored Pi package (PI-1); one not admitted throws PackageRejected. */
  async validatePackage(files: Record<string, string | Uint8Array>, manifest: Record<string, unknown>, deadlineSeconds?: number): Promise<Validation> {
    const listed = Object.entries(files).map(([path, content]) =>
      typeof content === "string" ? { path, text: content } : { path, base64: btoa(String.fromCharCode(...content)) },
    );
    const body = await this.request("POST", "/v1/validate_package", {
      ...this.identity,
      files: listed,
      manifest,
      ...(deadlineSeconds === undefined ? {} : { deadline_seconds: deadlineSeconds }),
    });
    const runtime = (body["runtime"] ?? {}) as Record<string, unknown>;
    return {
      validationId: String(body["validation_id"] ?? ""),
      profile: String(body["profile"] ?? ""),
      runtimeVersion: (runtime["version"] as string | null | undefined) ?? null,
      surface: (body["surface"] ?? {}) as Record<string, string[]>,
      durations: (body["durations"] ?? {}) as Record<string, number>,
      body,
    };
  }

  /** Opens a browser session; close it with `close()` (or `await using` where supported). */
  async openBrowser(url?: string): Promise<BrowserSession> {
    const opened = await this.request("POST", "/v1/browser_sessions", { ...this.identity, ...(url ? { url } : {}) });
    return new BrowserSession(this, opened, (method, path, body) => this.request(method, path, body));
  }

  /** The egress policy (the admin credential). */
  async egressPolicy(): Promise<Record<string, unknown>> {
    return this.request("GET", "/v1/admin/egress_policy", undefined, this.admin());
  }

  /** Replaces the egress policy (the admin credential). */
  async setEgressPolicy(policy: Record<string, unknown>): Promise<Record<string, unknown>> {
    return this.request("PUT", "/v1/admin/egress_policy", policy, this.admin());
  }

  private admin(): string {
    if (!this.options.adminToken) throw new CorralError("admin_token_missing", "the client was given no adminToken", 0, null, {});
    return this.options.adminToken;
  }

  /** The workspace's actor and conversation. */
  get scope(): { actor: string; conversation: string } {
    return { actor: this.identity.actor, conversation: this.identity.conversation };
  }
}

type Request = (method: string, path: string, body?: unknown) => Promise<Record<string, unknown>>;

/** An open browser session. */
export class BrowserSession {
  readonly id: string;
  closed: Record<string, unknown> | null = null;

  constructor(private readonly client: Client, readonly opened: Record<string, unknown>, private readonly request: Request) {
    this.id = String(opened["session"] ?? "");
  }

  /** One action (navigate, click, type, press, scroll, text, accessibility, evaluate, screenshot, wait). */
  act(action: string, args: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
    return this.request("POST", `/v1/browser_sessions/${this.id}/actions`, { ...this.client.scope, action: { action, ...args } });
  }

  /** A member's ticket to watch. */
  viewer(member: string): Promise<Record<string, unknown>> {
    return this.request("POST", `/v1/browser_sessions/${this.id}/viewers`, { ...this.client.scope, member });
  }

  async close(): Promise<Record<string, unknown>> {
    this.closed = await this.request("POST", `/v1/browser_sessions/${this.id}/close`, this.client.scope);
    return this.closed;
  }
}
