"""The baked Python stack's checks, run by scripts/build-python-stack inside the stack's own
interpreter (`<venv>/bin/python -I stackcheck.py COMMAND ...`), so that what it reads is what the
stack holds. Standard library only.

  pins LOCK          every pin of LOCK is installed at its exact version, and nothing else is
  table LOCK         prints the stack table (distribution, version, import names) to stdout
  imports TABLE      every import name of TABLE imports in an isolated interpreter of its own
  licenses LOCK DIR  copies each distribution's license files to DIR/<distribution>/

Exit status 0 when the check passed; 1 with the reasons on stderr when it did not.
"""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys

TABLE_HEADER = (
    "# distribution\tversion\timport names (comma-separated); written by"
    " scripts/build-python-stack --write-table from stack/python/requirements.txt; do not edit"
)
LICENSE_PREFIXES = ("LICENSE", "LICENCE", "COPYING", "NOTICE")
IMPORT_TIMEOUT_SECONDS = 120


def canonical(name):
    """The PEP 503 normalized name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def fail(problems, what):
    print(f"stackcheck: {what}:", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
    sys.exit(1)


def read_lock(path):
    """{distribution: version} of the lock's `name==version` lines."""
    pins = {}
    with open(path) as file:
        for line in file:
            match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
            if match:
                pins[canonical(match.group(1))] = match.group(2)
    if not pins:
        fail([f"{path} has no pins"], "the lock is empty")
    return pins


def installed():
    """{distribution: Distribution} of everything the interpreter sees."""
    found = {}
    for dist in importlib.metadata.distributions():
        name = canonical(dist.metadata["Name"])
        if name in found:
            fail([f"{name} is installed twice"], "the stack is inconsistent")
        found[name] = dist
    return found


def check_pins(lock):
    pins = read_lock(lock)
    dists = installed()
    problems = []
    for name, version in sorted(pins.items()):
        dist = dists.get(name)
        if dist is None:
            problems.append(f"{name}=={version} is not installed")
        elif dist.version != version:
            problems.append(f"{name}=={version} is installed at {dist.version}")
    problems.extend(f"{name} {dists[name].version} is installed but not in the lock"
                    for name in sorted(set(dists) - set(pins)))
    if problems:
        fail(problems, "the installed distributions differ from the lock")
    print(f"stackcheck: all {len(pins)} pins installed at their exact versions")


def keep_public(names):
    """Drops names starting with '_' unless they are all there is."""
    public = sorted(n for n in names if not n.startswith("_"))
    return public or sorted(names)


def import_names(dist):
    """The top-level import names of a distribution: top_level.txt, else its RECORD."""
    text = dist.read_text("top_level.txt")
    if text is not None:
        names = {line.strip().split("/")[0] for line in text.splitlines() if line.strip()}
    else:
        names = set()
        for path in dist.files or ():
            parts = path.parts
            top = parts[0]
            if top == ".." or top.endswith(".dist-info") or top == "__pycache__":
                continue  # scripts and data outside site-packages, metadata, caches
            if len(parts) > 1:
                names.add(top)  # a package (directories like numpy.libs fail the test below)
            elif top.endswith((".py", ".so")):
                names.add(top.split(".")[0])
    return keep_public({n for n in names if n.isidentifier()})


def print_table(lock):
    pins = read_lock(lock)
    dists = installed()
    problems, rows = [], []
    for name in sorted(pins):
        dist = dists.get(name)
        if dist is None:
            problems.append(f"{name} is not installed")
            continue
        names = import_names(dist)
        if not names:
            problems.append(f"{name} has no import names (no top_level.txt, nothing in RECORD)")
        rows.append(f"{name}\t{dist.version}\t{','.join(names)}")
    if problems:
        fail(problems, "cannot make the stack table")
    sys.stdout.write("\n".join([TABLE_HEADER, *rows]) + "\n")


def check_imports(table):
    problems, count = [], 0
    with open(table) as file:
        for line in file:
            if line.startswith("#") or not line.strip():
                continue
            name, version, names = line.rstrip("\n").split("\t")
            for module in names.split(","):
                count += 1
                result = subprocess.run(
                    [sys.executable, "-I", "-c", f"import {module}"],
                    capture_output=True, text=True, timeout=IMPORT_TIMEOUT_SECONDS,
                )
                if result.returncode != 0:
                    tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
                    problems.append(f"import {module} ({name} {version}): {tail}")
    if problems:
        fail(problems, "imports failed in an isolated interpreter")
    print(f"stackcheck: all {count} import names import in an isolated interpreter")


def dist_info_files(dist):
    """(path relative to the .dist-info directory, absolute path) of a distribution's metadata."""
    for path in dist.files or ():
        if path.parts[0].endswith(".dist-info") and len(path.parts) > 1:
            yield "/".join(path.parts[1:]), str(dist.locate_file(path))


def metadata_license(dist):
    """The license a distribution's metadata states, as text, or None."""
    meta = dist.metadata
    lines = [f"{meta['Name']} {meta['Version']}: no license file ships in the wheel;",
             "this is what its metadata states.", ""]
    found = False
    for field in ("License-Expression", "License"):
        value = meta.get(field)
        if value and value.strip() and value.strip().upper() != "UNKNOWN":
            lines.append(f"{field}: {value.strip()}")
            found = True
    for classifier in meta.get_all("Classifier") or ():
        if classifier.startswith("License ::"):
            lines.append(f"Classifier: {classifier}")
            found = True
    return "\n".join(lines) + "\n" if found else None


def copy_licenses(lock, dest):
    pins = read_lock(lock)
    dists = installed()
    problems, total = [], 0
    for name in sorted(pins):
        dist = dists.get(name)
        if dist is None:
            problems.append(f"{name} is not installed")
            continue
        target = os.path.join(dest, name)
        os.makedirs(target, exist_ok=True)
        copied = 0
        for relative, source in dist_info_files(dist):
            base = relative.split("/")[-1].upper()
            if relative.startswith("licenses/") or base.startswith(LICENSE_PREFIXES):
                os.makedirs(os.path.dirname(os.path.join(target, relative)), exist_ok=True)
                shutil.copyfile(source, os.path.join(target, relative))
                copied += 1
        if copied == 0:
            text = metadata_license(dist)
            if text is not None:
                with open(os.path.join(target, "LICENSE-METADATA.txt"), "w") as file:
                    file.write(text)
                copied = 1
        if copied == 0:
            problems.append(f"{name} {dist.version}: no license file and no license in its metadata")
        total += copied
    if problems:
        fail(problems, "license texts are missing")
    print(f"stackcheck: {total} license files of {len(pins)} distributions copied to {dest}")


def main(argv):
    match argv:
        case ["pins", lock]:
            check_pins(lock)
        case ["table", lock]:
            print_table(lock)
        case ["imports", table]:
            check_imports(table)
        case ["licenses", lock, dest]:
            copy_licenses(lock, dest)
        case _:
            print(__doc__, file=sys.stderr)
            sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
