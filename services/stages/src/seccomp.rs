//! The jail's seccomp filter: a deny list of what sandboxed code never needs.
//!
//! Written as BPF by hand rather than compiled by seccompiler because a deny list must also
//! refuse the x32 syscall ABI on x86_64 (the same calls under numbers with bit 30 set), which
//! seccompiler's compiler does not check. Denied calls fail with `EPERM`, so programs that probe
//! for a feature see an ordinary refusal; `clone3` fails with `ENOSYS` because its flags live in
//! memory the filter cannot read, and the C library then falls back to `clone`, whose flags it
//! can. A foreign architecture kills the process.

use seccompiler::sock_filter;

/// `BPF_LD | BPF_W | BPF_ABS` (the first two are zero).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
const BPF_JMP_JSET_K: u16 = 0x05 | 0x40;
const BPF_RET_K: u16 = 0x06;

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;

/// Offsets in `struct seccomp_data`.
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
/// The low 32 bits of argument `n` (little-endian on both supported architectures).
const fn offset_arg_low(n: u32) -> u32 {
    16 + 8 * n
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// x86_64's x32 ABI marks its syscall numbers with this bit.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `CLONE_NEWTIME`, absent from some libc versions.
const CLONE_NEWTIME: u32 = 0x0000_0080;

/// Every namespace flag `clone` accepts; a clone with any of them is refused.
const NAMESPACE_FLAGS: u32 = libc::CLONE_NEWNS as u32
    | libc::CLONE_NEWCGROUP as u32
    | libc::CLONE_NEWUTS as u32
    | libc::CLONE_NEWIPC as u32
    | libc::CLONE_NEWUSER as u32
    | libc::CLONE_NEWPID as u32
    | libc::CLONE_NEWNET as u32
    | CLONE_NEWTIME;

/// Calls refused outright: mounts and namespaces, tracing and other processes' memory, kernel
/// modules and kexec, keyrings, BPF and perf, the clock, swap, reboot, io_uring (whose operations
/// bypass this filter) and file handles (which open files by inode, outside any mount).
const DENIED_COMMON: &[libc::c_long] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_quotactl_fd,
    libc::SYS_syslog,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_vhangup,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_lookup_dcookie,
    libc::SYS_nfsservctl,
];

/// x86_64-only calls refused as well: port I/O, the LDT, and long-removed calls.
#[cfg(target_arch = "x86_64")]
const DENIED_ARCH: &[libc::c_long] = &[
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_modify_ldt,
    libc::SYS_uselib,
    libc::SYS__sysctl,
];
#[cfg(target_arch = "aarch64")]
const DENIED_ARCH: &[libc::c_long] = &[];

/// `ioctl` requests refused: pushing bytes into a terminal's input, and the console's.
const DENIED_IOCTLS: &[u32] = &[libc::TIOCSTI as u32, libc::TIOCLINUX as u32];

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

fn nr(call: libc::c_long) -> u32 {
    u32::try_from(call).expect("syscall numbers are small and positive")
}

/// The filter program.
pub fn program() -> Vec<sock_filter> {
    let eperm = RET_ERRNO | libc::EPERM as u32;
    let enosys = RET_ERRNO | libc::ENOSYS as u32;
    let mut program = vec![
        stmt(BPF_LD_W_ABS, OFFSET_ARCH),
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, OFFSET_NR),
    ];
    #[cfg(target_arch = "x86_64")]
    program.extend([
        jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET_K, enosys),
    ]);
    // clone: refused with any namespace flag in its first argument.
    program.extend([
        jump(BPF_JMP_JEQ_K, nr(libc::SYS_clone), 0, 4),
        stmt(BPF_LD_W_ABS, offset_arg_low(0)),
        jump(BPF_JMP_JSET_K, NAMESPACE_FLAGS, 0, 1),
        stmt(BPF_RET_K, eperm),
        stmt(BPF_RET_K, RET_ALLOW),
    ]);
    program.extend([
        jump(BPF_JMP_JEQ_K, nr(libc::SYS_clone3), 0, 1),
        stmt(BPF_RET_K, enosys),
    ]);
    // ioctl: refused for the requests above, whatever the descriptor.
    let ioctls = u8::try_from(DENIED_IOCTLS.len()).expect("a handful of ioctls");
    program.push(jump(BPF_JMP_JEQ_K, nr(libc::SYS_ioctl), 0, ioctls + 3));
    program.push(stmt(BPF_LD_W_ABS, offset_arg_low(1)));
    for (index, request) in DENIED_IOCTLS.iter().enumerate() {
        let to_deny = ioctls - u8::try_from(index).expect("a handful of ioctls");
        program.push(jump(BPF_JMP_JEQ_K, *request, to_deny, 0));
    }
    program.push(stmt(BPF_RET_K, RET_ALLOW));
    program.push(stmt(BPF_RET_K, eperm));
    // The deny list, each jumping to the shared EPERM return at the end.
    let denied: Vec<u32> = DENIED_COMMON
        .iter()
        .chain(DENIED_ARCH)
        .map(|call| nr(*call))
        .collect();
    let first = program.len();
    let deny_at = first + denied.len() + 1;
    for (index, call) in denied.iter().enumerate() {
        let distance = deny_at - (first + index) - 1;
        let jt = u8::try_from(distance).expect("the deny list fits one BPF jump");
        program.push(jump(BPF_JMP_JEQ_K, *call, jt, 0));
    }
    program.push(stmt(BPF_RET_K, RET_ALLOW));
    program.push(stmt(BPF_RET_K, eperm));
    assert_eq!(program.len(), deny_at + 1);
    program
}

/// Installs the filter on the calling thread (and sets `PR_SET_NO_NEW_PRIVS`, which it needs).
pub fn install() -> Result<(), String> {
    seccompiler::apply_filter(&program()).map_err(|error| error.to_string())
}

/// Installs a filter that allows everything: proves that filters can be installed at all.
pub fn install_probe() -> Result<(), String> {
    seccompiler::apply_filter(&[stmt(BPF_RET_K, RET_ALLOW)]).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `program` on a synthetic `seccomp_data`, as the kernel would.
    fn run(program: &[sock_filter], call: u32, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::new();
        data.extend_from_slice(&call.to_le_bytes());
        data.extend_from_slice(&arch.to_le_bytes());
        data.extend_from_slice(&0u64.to_le_bytes());
        for arg in args {
            data.extend_from_slice(&arg.to_le_bytes());
        }
        let mut accumulator: u32 = 0;
        let mut pc = 0;
        for _ in 0..program.len() {
            let op = &program[pc];
            match op.code {
                BPF_LD_W_ABS => {
                    let at = op.k as usize;
                    accumulator = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
                    pc += 1;
                }
                BPF_RET_K => return op.k,
                BPF_JMP_JEQ_K | BPF_JMP_JGE_K | BPF_JMP_JSET_K => {
                    let taken = match op.code {
                        BPF_JMP_JEQ_K => accumulator == op.k,
                        BPF_JMP_JGE_K => accumulator >= op.k,
                        _ => accumulator & op.k != 0,
                    };
                    pc += 1 + usize::from(if taken { op.jt } else { op.jf });
                }
                other => panic!("unknown op {other:#x}"),
            }
        }
        panic!("fell off the end");
    }

    fn verdict(call: libc::c_long, args: [u64; 6]) -> u32 {
        run(&program(), nr(call), AUDIT_ARCH, args)
    }

    #[test]
    fn ordinary_calls_pass_and_denied_ones_fail_with_eperm() {
        let eperm = RET_ERRNO | libc::EPERM as u32;
        assert_eq!(verdict(libc::SYS_read, [0; 6]), RET_ALLOW);
        assert_eq!(verdict(libc::SYS_openat, [0; 6]), RET_ALLOW);
        for call in DENIED_COMMON.iter().chain(DENIED_ARCH) {
            assert_eq!(verdict(*call, [0; 6]), eperm, "syscall {call}");
        }
    }

    #[test]
    fn clone_with_a_namespace_flag_is_refused_and_plain_clone_is_not() {
        let eperm = RET_ERRNO | libc::EPERM as u32;
        let thread = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
        assert_eq!(verdict(libc::SYS_clone, [thread, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(verdict(libc::SYS_clone, [0x11, 0, 0, 0, 0, 0]), RET_ALLOW);
        for flag in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWPID,
        ] {
            let flags = flag as u64 | 0x11;
            assert_eq!(verdict(libc::SYS_clone, [flags, 0, 0, 0, 0, 0]), eperm);
        }
        assert_eq!(
            verdict(libc::SYS_clone3, [0; 6]),
            RET_ERRNO | libc::ENOSYS as u32
        );
    }

    #[test]
    fn terminal_injection_is_refused() {
        let eperm = RET_ERRNO | libc::EPERM as u32;
        assert_eq!(
            verdict(libc::SYS_ioctl, [0, libc::TIOCSTI, 0, 0, 0, 0]),
            eperm
        );
        assert_eq!(
            verdict(libc::SYS_ioctl, [0, libc::TCGETS, 0, 0, 0, 0]),
            RET_ALLOW
        );
    }

    #[test]
    fn foreign_architectures_and_x32_are_refused() {
        let program = program();
        assert_eq!(run(&program, 0, 0x4000_0003, [0; 6]), RET_KILL_PROCESS);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            run(
                &program,
                X32_SYSCALL_BIT | nr(libc::SYS_mount),
                AUDIT_ARCH,
                [0; 6]
            ),
            RET_ERRNO | libc::ENOSYS as u32
        );
    }
}
