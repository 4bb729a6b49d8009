//! The jail's filesystem, built by pid 1 of the jail in its own mount namespace: a small tmpfs
//! root that becomes read-only, the system directories and the font cache bound read-only, a synthesized /etc, a
//! minimal /dev, a fresh /proc for the jail's pid namespace, the CPUs online the run is told of
//! under /sys, and the run's workspace, /tmp and /dev/shm as the only writable places.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CpuSet, sched_getaffinity};
use nix::sys::statvfs::{FsFlags, statvfs};
use nix::unistd::{Pid, chdir, pivot_root};

/// System directories bound read-only (or recreated as the same symlink, on merged-/usr systems).
const SYSTEM_ENTRIES: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// The parts of the host's /etc the interpreters need: the dynamic linker's cache, name-service
/// and time-zone configuration, certificates, MIME types, fonts and the alternatives links.
/// Nothing else of /etc is visible; passwd, group, hosts and hostname are written fresh.
const ETC_ENTRIES: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "localtime",
    "timezone",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "mime.types",
    "fonts",
    "alternatives",
    "os-release",
    "debian_version",
    "protocols",
    "services",
    "python3",
    "python3.11",
    "matplotlibrc",
    // A browser session's window manager and sound server (BROW-1).
    "xdg",
    "pulse",
];

/// fontconfig's system cache, which the jail sees read-only when the host has one.
const FONT_CACHE: &str = "/var/cache/fontconfig";

/// Device nodes bound from the host's /dev.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom"];

/// Size and inode bounds of the jail's own root and /dev (they hold only mount points and a few
/// small files, and become read-only before the code starts).
const ROOT_TMPFS_OPTIONS: &str = "size=1m,nr_inodes=4096,mode=0755";
const DEV_TMPFS_OPTIONS: &str = "size=64k,nr_inodes=64,mode=0755";

fn step<T, E: std::fmt::Display>(
    result: Result<T, E>,
    what: impl FnOnce() -> String,
) -> Result<T, String> {
    result.map_err(|error| format!("{}: {error}", what()))
}

/// What the jail's filesystem is made of.
pub struct Layout<'a> {
    /// The run directory (`workspace`, `scratch/tmp`, `scratch/shm`, `code`, `root`).
    pub run_dir: &'a Path,
    /// The code's uid and gid inside the jail, for the synthesized passwd and group.
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// The baked Python stack, bound read-only at the same path (its environment names its own
    /// absolute paths).
    pub python_stack: Option<&'a Path>,
    /// The baked Pi runtime (PI-1), bound read-only at the same path for a package validation.
    pub pi_runtime: Option<&'a Path>,
    /// Whether to mount the run directory's `resources` read-only at
    /// `corral_core::projection::MOUNT_DIR` (PROJ-6): outside the workspace, never executable.
    pub resources: bool,
    /// The CPUs the code is told it has, listed in the jail's `/sys/devices/system/cpu/online`.
    pub cpus: u32,
}

/// Builds the jail's root and makes it the calling process's root. The caller must be alone in a
/// new mount namespace (and, for /proc, pid 1 of a new pid namespace).
pub fn build_and_enter(layout: &Layout<'_>) -> Result<(), String> {
    // Nothing mounted here may propagate back to the supervisor's namespace.
    step(
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        ),
        || "make / private".to_owned(),
    )?;
    // Read once: every mount this build makes is added to it as it is made (a reading per bind
    // was a tenth of the machine's CPU under load), and one reading at the end proves it.
    let mut table = Table::read()?;
    let root = layout.run_dir.join("root");
    step(
        mount(
            Some("corral-root"),
            &root,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(ROOT_TMPFS_OPTIONS),
        ),
        || "mount the root tmpfs".to_owned(),
    )?;
    table.mounted(&root);
    system_entries(&mut table, &root)?;
    for baked in [layout.python_stack, layout.pi_runtime]
        .into_iter()
        .flatten()
    {
        let inside = root.join(baked.strip_prefix("/").unwrap_or(baked));
        let read_only = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        bind_dir(&mut table, baked, &inside, read_only)?;
    }
    etc(&mut table, &root, layout)?;
    online_cpus(&root, layout.cpus)?;
    dev(&mut table, &root, layout.run_dir)?;
    run_binds(&mut table, &root, layout)?;
    table.covers(&root)?;
    mount_proc(&root)?;
    enter(&root)?;
    remount_read_only()
}

/// Binds the host's font cache, the run's workspace, /tmp and code, and its resources when it has
/// them, into `root`: only the workspace and /tmp writable.
fn run_binds(table: &mut Table, root: &Path, layout: &Layout<'_>) -> Result<(), String> {
    let writable = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let read_only = writable | MsFlags::MS_RDONLY;
    // The host's font cache, read-only: without it every Chromium (and fontconfig user) scans
    // every font at start and writes a cache into its fresh home (BROW-1 open latency).
    let font_cache = Path::new(FONT_CACHE);
    if font_cache.is_dir() {
        bind_dir(
            table,
            font_cache,
            &root.join(FONT_CACHE.trim_start_matches('/')),
            read_only | MsFlags::MS_NOEXEC,
        )?;
    }
    bind_dir(
        table,
        &layout.run_dir.join("workspace"),
        &root.join("workspace"),
        writable,
    )?;
    bind_dir(
        table,
        &layout.run_dir.join("scratch/tmp"),
        &root.join("tmp"),
        writable,
    )?;
    bind_dir(
        table,
        &layout.run_dir.join("code"),
        &root.join("run/corral"),
        read_only | MsFlags::MS_NOEXEC,
    )?;
    if layout.resources {
        let inside = corral_core::projection::MOUNT_DIR.trim_start_matches('/');
        bind_dir(
            table,
            &layout.run_dir.join("resources"),
            &root.join(inside),
            read_only | MsFlags::MS_NOEXEC,
        )?;
    }
    Ok(())
}

/// Mounts a fresh /proc for the jail's pid namespace in `root`.
fn mount_proc(root: &Path) -> Result<(), String> {
    let proc = root.join("proc");
    step(fs::create_dir_all(&proc), || "create /proc".to_owned())?;
    step(
        mount(
            Some("proc"),
            &proc,
            Some("proc"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        ),
        || "mount /proc".to_owned(),
    )?;
    Ok(())
}

/// Remounts the entered root and its /dev read-only.
fn remount_read_only() -> Result<(), String> {
    let read_only = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_RDONLY;
    step(
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | read_only,
            None::<&str>,
        ),
        || "remount / read-only".to_owned(),
    )?;
    step(
        mount(
            None::<&str>,
            "/dev",
            None::<&str>,
            MsFlags::MS_BIND
                | MsFlags::MS_REMOUNT
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NOEXEC,
            None::<&str>,
        ),
        || "remount /dev read-only".to_owned(),
    )?;
    Ok(())
}

/// Pivots into `root` and detaches the old root, so nothing of the host stays reachable.
fn enter(root: &Path) -> Result<(), String> {
    step(chdir(root), || "chdir to the new root".to_owned())?;
    step(pivot_root(".", "."), || "pivot_root".to_owned())?;
    step(umount2(".", MntFlags::MNT_DETACH), || {
        "detach the old root".to_owned()
    })?;
    step(chdir("/"), || "chdir /".to_owned())
}

fn system_entries(table: &mut Table, root: &Path) -> Result<(), String> {
    for name in SYSTEM_ENTRIES {
        let host = Path::new("/").join(name);
        mirror(table, &host, &root.join(name))?;
    }
    Ok(())
}

/// Recreates `host` at `target`: the same symlink, or a read-only bind of the file or directory.
/// A missing `host` is skipped.
fn mirror(table: &mut Table, host: &Path, target: &Path) -> Result<(), String> {
    let Ok(meta) = fs::symlink_metadata(host) else {
        return Ok(());
    };
    let read_only = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if meta.file_type().is_symlink() {
        let points_to = step(fs::read_link(host), || {
            format!("read link {}", host.display())
        })?;
        step(symlink(&points_to, target), || {
            format!("link {}", target.display())
        })
    } else if meta.is_dir() {
        bind_dir(table, host, target, read_only)
    } else {
        bind_file(table, host, target, read_only)
    }
}

/// Chromium's managed policy (BROW-3): the vendor calls its flags cannot reach, such as the default
/// search provider's prefetch, switched off where Chromium reads policy, `/etc/chromium`; and the
/// warning bar `--no-sandbox` would put across the window members watch (decision 0027).
const CHROMIUM_POLICY: &str = include_str!("browser/policy.json");

fn etc(table: &mut Table, root: &Path, layout: &Layout<'_>) -> Result<(), String> {
    let etc = root.join("etc");
    step(fs::create_dir_all(&etc), || "create /etc".to_owned())?;
    for name in ETC_ENTRIES {
        mirror(table, &Path::new("/etc").join(name), &etc.join(name))?;
    }
    let (uid, gid) = (layout.uid, layout.gid);
    let files = [
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:/usr/sbin/nologin\ncorral:x:{uid}:{gid}:corral:/tmp:/usr/sbin/nologin\n"
            ),
        ),
        ("group", format!("root:x:0:\ncorral:x:{gid}:\n")),
        (
            "hosts",
            "127.0.0.1\tlocalhost corral\n::1\tlocalhost\n".to_owned(),
        ),
        ("hostname", "corral\n".to_owned()),
    ];
    for (name, text) in files {
        step(fs::write(etc.join(name), text), || {
            format!("write /etc/{name}")
        })?;
    }
    let policies = etc.join("chromium/policies/managed");
    step(fs::create_dir_all(&policies), || {
        "create /etc/chromium/policies/managed".to_owned()
    })?;
    step(
        fs::write(policies.join("corral.json"), CHROMIUM_POLICY),
        || "write the Chromium policy".to_owned(),
    )
}

/// The jail's only files under /sys: the CPUs online, as many as the run is told it has and the
/// first of those this process may run on, and the host's possible CPUs as they are. glibc reads
/// `online` first when a program asks how many CPUs are online (`os.cpu_count()`,
/// `multiprocessing`), so that code sizing a pool by it sizes it to the worker's share within the
/// process bound, not to the machine (decision 0064); `possible` keeps the count of configured
/// CPUs the host's. Part of the root tmpfs, read-only with it.
fn online_cpus(root: &Path, cpus: u32) -> Result<(), String> {
    let dir = root.join("sys/devices/system/cpu");
    step(fs::create_dir_all(&dir), || {
        "create /sys/devices/system/cpu".to_owned()
    })?;
    let allowed: Vec<usize> = sched_getaffinity(Pid::from_raw(0))
        .map(|set| {
            (0..CpuSet::count())
                .filter(|cpu| set.is_set(*cpu).unwrap_or(false))
                .collect()
        })
        .unwrap_or_default();
    step(
        fs::write(
            dir.join("online"),
            corral_core::bounds::online_cpus_text(cpus, &allowed),
        ),
        || "write /sys/devices/system/cpu/online".to_owned(),
    )?;
    if let Ok(possible) = fs::read_to_string("/sys/devices/system/cpu/possible") {
        step(fs::write(dir.join("possible"), possible), || {
            "write /sys/devices/system/cpu/possible".to_owned()
        })?;
    }
    Ok(())
}

fn dev(table: &mut Table, root: &Path, run_dir: &Path) -> Result<(), String> {
    let dev = root.join("dev");
    step(fs::create_dir_all(&dev), || "create /dev".to_owned())?;
    step(
        mount(
            Some("corral-dev"),
            &dev,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some(DEV_TMPFS_OPTIONS),
        ),
        || "mount /dev".to_owned(),
    )?;
    table.mounted(&dev);
    for name in DEVICES {
        // Device nodes stay writable (writes to /dev/null are not writes to a filesystem).
        bind_file(
            table,
            &Path::new("/dev").join(name),
            &dev.join(name),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        )?;
    }
    for (name, points_to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        step(symlink(points_to, dev.join(name)), || {
            format!("link /dev/{name}")
        })?;
    }
    bind_dir(
        table,
        &run_dir.join("scratch/shm"),
        &dev.join("shm"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    )
}

fn bind_dir(table: &mut Table, source: &Path, target: &Path, flags: MsFlags) -> Result<(), String> {
    step(fs::create_dir_all(target), || {
        format!("create {}", target.display())
    })?;
    bind(table, source, target, flags)
}

fn bind_file(
    table: &mut Table,
    source: &Path,
    target: &Path,
    flags: MsFlags,
) -> Result<(), String> {
    step(fs::write(target, b""), || {
        format!("create {}", target.display())
    })?;
    bind(table, source, target, flags)
}

/// Binds `source` (with everything mounted below it) at `target`, then remounts each of those
/// mounts with `flags` added. The flags a mount already has are kept: in a user namespace the
/// kernel refuses to clear a flag inherited from a more privileged namespace, and that includes
/// the access-time flags.
fn bind(table: &mut Table, source: &Path, target: &Path, flags: MsFlags) -> Result<(), String> {
    step(
        mount(
            Some(source),
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        ),
        || format!("bind {} at {}", source.display(), target.display()),
    )?;
    table.bound(source, target);
    for point in table.under(target) {
        let kept = match statvfs(&point) {
            Ok(found) => found.flags(),
            // A mount the kernel did not copy (one hidden beneath another on the host) leaves no
            // path to remount; the table's closing reading proves nothing was missed.
            Err(nix::errno::Errno::ENOENT) => continue,
            Err(error) => return Err(format!("statvfs {}: {error}", point.display())),
        };
        let mut remount = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | flags;
        for (has, keep) in [
            (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
            (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
            (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
            (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
            (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
            (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
            (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
        ] {
            if kept.contains(has) {
                remount |= keep;
            }
        }
        step(
            mount(None::<&str>, &point, None::<&str>, remount, None::<&str>),
            || format!("remount {}", point.display()),
        )?;
    }
    Ok(())
}

/// The mount points of the jail's mount namespace, read once and kept as the build adds to it: a
/// bind of a source with everything below it adds the target and, below it, a copy of each mount
/// point below the source, as the kernel's recursive bind does.
struct Table {
    points: Vec<PathBuf>,
}

impl Table {
    fn read() -> Result<Self, String> {
        let text = step(fs::read_to_string("/proc/self/mountinfo"), || {
            "read mountinfo".to_owned()
        })?;
        Ok(Self {
            points: mount_points(&text),
        })
    }

    /// A fresh mount at `target`.
    fn mounted(&mut self, target: &Path) {
        self.points.push(target.to_owned());
    }

    /// A recursive bind of `source` at `target`.
    fn bound(&mut self, source: &Path, target: &Path) {
        // The table holds resolved paths; the kernel resolves the source the same way.
        let source = fs::canonicalize(source).unwrap_or_else(|_| source.to_owned());
        let copies: Vec<PathBuf> = self
            .points
            .iter()
            .filter_map(|point| point.strip_prefix(&source).ok())
            .filter(|below| !below.as_os_str().is_empty())
            .map(|below| target.join(below))
            .collect();
        self.mounted(target);
        self.points.extend(copies);
    }

    /// The mount points at or below `target`, in the order they were made.
    fn under(&self, target: &Path) -> Vec<PathBuf> {
        self.points
            .iter()
            .filter(|point| point.starts_with(target))
            .cloned()
            .collect()
    }

    /// Proves the table by reading the namespace's mounts once more: every mount at or below
    /// `root` must be one the build made and remounted with its flags, or the jail is not entered.
    fn covers(&self, root: &Path) -> Result<(), String> {
        let now = Self::read()?;
        let made: std::collections::HashSet<&Path> =
            self.points.iter().map(PathBuf::as_path).collect();
        match now
            .points
            .iter()
            .find(|point| point.starts_with(root) && !made.contains(point.as_path()))
        {
            Some(missed) => Err(format!(
                "a mount at {} was not made by the jail's build",
                missed.display()
            )),
            None => Ok(()),
        }
    }
}

/// The mount points listed in a mountinfo table, in order.
pub fn mount_points(table: &str) -> Vec<PathBuf> {
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape(field)))
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and so on).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let escaped = bytes.get(at + 1..at + 4).and_then(|digits| {
            let text = std::str::from_utf8(digits).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[at], escaped) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                at += 4;
            }
            (byte, _) => {
                out.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recursive_bind_adds_its_target_and_a_copy_of_each_mount_below_its_source() {
        let mut table = Table {
            points: ["/", "/usr", "/usr/share/doc", "/usrlocal", "/proc"]
                .map(PathBuf::from)
                .to_vec(),
        };
        table.bound(Path::new("/usr"), Path::new("/jail/usr"));
        table.bound(Path::new("/proc"), Path::new("/jail/usr/share/doc/proc"));
        assert_eq!(
            table.under(Path::new("/jail/usr")),
            [
                "/jail/usr",
                "/jail/usr/share/doc",
                "/jail/usr/share/doc/proc"
            ]
            .map(PathBuf::from)
        );
        assert_eq!(
            table.under(Path::new("/jail/usr/share/doc/proc")),
            ["/jail/usr/share/doc/proc"].map(PathBuf::from)
        );
    }

    #[test]
    fn mountinfo_points_are_unescaped() {
        let table = "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
                     50 27 0:40 / /run/a\\040b rw - tmpfs tmpfs rw\n";
        assert_eq!(
            mount_points(table),
            [PathBuf::from("/proc"), PathBuf::from("/run/a b")]
        );
    }
}
