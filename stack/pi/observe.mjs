// The disposable child of Pi package validation (PI-1): loads one authored package with Pi's real
// loaders, in the worker's jail, and writes one bounded observation line to stdout:
//   corral-pi-observation <json>
// It is untrusted the moment it imports authored code: the worker's supervisor (the trusted
// parent, outside the jail) parses the line with corral-core's rules, bounded, and believes
// nothing the line cannot prove against the server's file set.
//
// usage: node observe.mjs skills|extension <package-dir>
// env: HOME, PI_CODING_AGENT_DIR (empty scratch directories), PI_OFFLINE=1.
import fs from "node:fs";
import path from "node:path";

const MARK = "corral-pi-observation ";
const LIST_MAX = 256;
const TEXT_MAX = 1024;

const [mode, packageArg] = process.argv.slice(2);
const root = path.resolve(packageArg ?? ".");
const scratch = process.env.HOME ?? "/tmp";
const agentDir = process.env.PI_CODING_AGENT_DIR ?? path.join(scratch, "agent");
const cwd = path.join(scratch, "cwd");

const observation = {
  runtime: { package: "@mariozechner/pi-coding-agent", version: null },
  mode,
  skills: [],
  prompts: [],
  themes: [],
  extensions: [],
  providers: [],
  errors: [],
  diagnostics: [],
};

const text = (value) => (typeof value === "string" ? value.slice(0, TEXT_MAX) : null);
const rel = (file) => {
  const relative = path.relative(root, path.resolve(String(file ?? "")));
  return relative.split(path.sep).join("/").slice(0, TEXT_MAX);
};
const cap = (list) => list.slice(0, LIST_MAX);
const error = (file, message) => observation.errors.push({ path: rel(file ?? root), message: text(String(message)) });

function emit() {
  for (const key of ["skills", "prompts", "themes", "extensions", "providers", "errors", "diagnostics"]) {
    observation[key] = cap(observation[key]);
  }
  // Node may leave stdout non-blocking: write every byte, waiting out a full pipe.
  const line = Buffer.from(`\n${MARK}${JSON.stringify(observation)}\n`);
  const pause = new Int32Array(new SharedArrayBuffer(4));
  for (let written = 0; written < line.length; ) {
    try {
      written += fs.writeSync(1, line, written);
    } catch (e) {
      if (e.code !== "EAGAIN") throw e;
      Atomics.wait(pause, 0, 0, 5);
    }
  }
  process.exit(0);
}

try {
  if (mode !== "skills" && mode !== "extension") throw new Error(`unknown mode ${mode}`);
  fs.mkdirSync(cwd, { recursive: true });
  fs.mkdirSync(agentDir, { recursive: true });
  const pi = await import("@mariozechner/pi-coding-agent");
  observation.runtime.version = text(pi.VERSION);
  const settingsManager = pi.SettingsManager.inMemory();
  // What the package declares, resolved by Pi's package manager (a local directory: no npm, no git).
  const manager = new pi.DefaultPackageManager({ cwd, agentDir, settingsManager });
  const resolved = await manager.resolveExtensionSources([root], { temporary: true });
  const enabled = (list) => list.filter((entry) => entry.enabled).map((entry) => entry.path);
  if (mode === "skills" && enabled(resolved.extensions).length > 0) {
    // A skill-only package imports no code: one that resolves an extension is not one.
    for (const file of enabled(resolved.extensions)) error(file, "a skill-only package resolved an extension");
    emit();
  }
  if (mode === "skills") {
    const skills = pi.loadSkills({ cwd, agentDir, includeDefaults: false, skillPaths: enabled(resolved.skills) });
    observation.skills = skills.skills.map((s) => ({ name: text(s.name), description: text(s.description), path: rel(s.filePath) }));
    observation.diagnostics.push(...skills.diagnostics.map((d) => ({ type: text(d.type), message: text(d.message), path: rel(d.path) })));
  }
  // Everything else exactly as `pi -e <package>` loads it; in skills mode it has no code to import.
  const loader = new pi.DefaultResourceLoader({
    cwd,
    agentDir,
    settingsManager,
    additionalExtensionPaths: [root],
    noExtensions: true,
    noSkills: true,
    noPromptTemplates: true,
    noThemes: true,
    noContextFiles: true,
  });
  await loader.reload();
  if (mode === "extension") {
    const skills = loader.getSkills();
    observation.skills = skills.skills.map((s) => ({ name: text(s.name), description: text(s.description), path: rel(s.filePath) }));
    observation.diagnostics.push(...skills.diagnostics.map((d) => ({ type: text(d.type), message: text(d.message), path: rel(d.path) })));
  }
  const prompts = loader.getPrompts();
  observation.prompts = prompts.prompts.map((p) => ({ name: text(p.name), description: text(p.description), path: rel(p.filePath) }));
  observation.diagnostics.push(...prompts.diagnostics.map((d) => ({ type: text(d.type), message: text(d.message), path: rel(d.path) })));
  const themes = loader.getThemes();
  observation.themes = themes.themes.map((t) => ({ name: text(t.name), path: rel(t.sourcePath) }));
  observation.diagnostics.push(...themes.diagnostics.map((d) => ({ type: text(d.type), message: text(d.message), path: rel(d.path) })));
  const extensions = loader.getExtensions();
  observation.extensions = extensions.extensions.map((e) => ({
    path: rel(e.path),
    tools: cap([...e.tools.values()].map((t) => ({ name: text(t.definition?.name), description: text(t.definition?.description) }))),
    commands: cap([...e.commands.values()].map((c) => ({ name: text(c.name), description: text(c.description) }))),
    hooks: cap([...e.handlers.keys()].map(text)),
    flags: cap([...e.flags.keys()].map(text)),
    shortcuts: cap([...e.shortcuts.keys()].map(text)),
    renderers: cap([...e.messageRenderers.keys()].map(text)),
  }));
  for (const failure of extensions.errors) error(failure.path, failure.error);
  observation.providers = (extensions.runtime?.pendingProviderRegistrations ?? []).map((p) => text(p.name));
} catch (e) {
  error(root, e instanceof Error ? `${e.name}: ${e.message}` : String(e));
}
emit();
