//! `usdt-args`: USDT probes under provider `tracer_test` covering every x86-64 argument form,
//! with known values, so a tracer's decoded arguments can be checked one by one.
//!
//! ```text
//! usdt-args [--loops N] [--interval-ms I] [--wait-for-signal]
//! ```
//! Prints `ready pid=<PID>` (flushed), waits for SIGUSR1 if asked, then N times (default 1,
//! sleeping I ms between rounds, default 0) fires every probe once in the order listed
//! below — `multi` once from each of its 3 sites, `guarded` only while its semaphore is
//! non-zero — and finally prints one JSON line (see [Output](#output)). x86-64 Linux only.
//!
//! The notes are written by hand (`asm!` + `.note.stapsdt`, as `sys/sdt.h` does) so that each
//! argument spec string is exactly the one below. "Value" is what a correct decoder returns,
//! as a signed 64-bit integer (an unsigned 8-byte value is its bit pattern read as i64).
//! Registers named by a sub-register hold garbage in their upper bits, so a decoder that does
//! not truncate to the argument size gets a different value.
//!
//! | probe | argument spec | values |
//! |---|---|---|
//! | `noargs` | (empty) | — |
//! | `consts` | `-4@$-5 8@$42 1@$255` | -5, 42, 255 |
//! | `regs` | `8@%rdi -4@%esi 2@%dx -1@%cl 8@%r8 -8@%r9` | -2401053089206439923 (0xdeadbeefcafef00d), -7, 48879 (0xbeef), -2, 1, -1 |
//! | `mem` | `-8@-16(%rbp) 8@8(%rsp) 4@(%rax) -2@6(%rdx) -1@-1(%rcx)` | -1234567890123, 81985529216486895 (0x0123456789abcdef), 4294967294 (0xfffffffe), -32767 (0x8001), -128 (0x80) |
//! | `indexed` | `-4@8(%rax,%rcx,4) 8@(%rdx,%rcx,8) -2@-2(%rsi,%rdi,2) 1@(%r8,%r9,1)` | -123456, 72623859790382856 (0x0102030405060708), -3003, 246 (0xf6) |
//! | `twelve` | `-8@%rdi 8@$2 -4@%esi -8@%rdx 8@$5 -8@%rcx -8@%r8 4@$8 -8@%r9 -8@%r10 2@%r11w -8@%rax` | 1, 2, ..., 12 |
//! | `signs` | `1@%dil -1@%sil 2@%dx -2@%cx 4@%r8d -4@%r9d 8@%r10 -8@%r11` | 135, -121, 34439, -31097, 2223343239, -2071624057, -9186918263483431289, -9186918263483431289 |
//! | `subregs` | `1@%al 2@%bx 4@%ecx 1@%dl 2@%si 4@%edi 1@%r8b 2@%r9w 4@%r10d 1@%r11b 2@%r12w 4@%r13d` | 1, 2, ..., 12 |
//! | `fullregs` | `-8@%rbx -8@%rbp -8@%r12 -8@%r13 -8@%r14 -8@%r15` | -1001, -1002, -1003, -1004, -1005, -1006 |
//! | `multi` site 1 | `-4@$1 -8@%rdi` | 1, 101 |
//! | `multi` site 2 | `-4@$2 -8@%rsi` | 2, 102 |
//! | `multi` site 3 | `-4@$3 -8@(%rax)` | 3, 103 |
//! | `guarded` | `-8@%rdi -4@$-1` | 7777, -1 |
//!
//! Details:
//! - `regs`: the full registers are rdi = 0xdeadbeefcafef00d, rsi = 0x12345678fffffff9,
//!   rdx = 0x111122223333beef, rcx = 0xaaaabbbbccccddfe, r8 = 1, r9 = 0xffffffffffffffff.
//! - `mem`: the asm block pushes %rbp, sets %rbp = %rsp, reserves 32 bytes and stores the
//!   first two values at -16(%rbp) and 8(%rsp) (a frame of its own, so the stack is valid
//!   memory when the probe fires); %rax points to a static u32, %rdx to a static [i16; 4]
//!   whose element 3 is read, %rcx one past the end of a static [u8; 4] whose last byte is read.
//! - `indexed`: static arrays; base %rax ([i32; 8]), %rdx ([u64; 4]), %rsi ([i16; 8]),
//!   %r8 ([u8; 8]); index %rcx = 3, %rdi = 4, %r9 = 6; elements 5, 3, 3 and 6 are read.
//! - `twelve`: rsi = 0xffffffff00000003 and r11 = 0xffffffffffff000b (truncation matters).
//! - `signs`: all eight registers hold 0x8081828384858687: each size once unsigned, once
//!   signed.
//! - `subregs`: the low part holds the value, the rest garbage (rax = 0xaaaaaaaaaaaaaa01, ...).
//!   %rbx is set inside the asm block, between a push and a pop.
//! - `fullregs`: %rbx and %rbp are set inside the asm block between pushes and pops; while
//!   this probe fires %rbp is not a frame pointer, so a stack walk from it is meaningless.
//! - `multi`: one probe name, three notes with different argument specs (per-site specs).
//! - `guarded`: semaphore = address of a 2-byte counter in `.probes`, read with
//!   `read_volatile` before each would-be firing; the probe fires only if it is non-zero.
//!   The counter is page-aligned, so `.probes` never shares a file page with the RELRO
//!   segment (see the `probes` crate docs).
//!
//! # Output
//! One JSON line: `{"pid":P,"loops":N,"fired":{"noargs":N,"consts":N,"regs":N,"mem":N,
//! "indexed":N,"twelve":N,"signs":N,"subregs":N,"fullregs":N,"multi":3N,"guarded":G},
//! "multi_sites":[N,N,N],"guarded_semaphore_addr":A,"guarded_semaphore_at_ready":R,
//! "guarded_semaphore_at_start":S,"guarded_semaphore":F}` where G is the number of rounds in
//! which the semaphore was non-zero, A its run-time address, R its value when the ready line
//! was printed, S when the first round started (after the signal), F at the end.

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("usdt-args hand-writes x86-64 SystemTap notes and only builds for x86-64 Linux");

use std::arch::asm;
use std::ptr::{addr_of, read_volatile};
use std::time::Duration;

use anyhow::{Result, bail};
use tests::{Args, announce_ready, json_array, print_line};

/// The assembly of one SystemTap SDT note (provider `tracer_test`) for the probe site at the
/// local label `990` just before it, with the exact argument spec `$args`. With `semaphore`,
/// the note's semaphore is the asm operand `{semaphore}` (a `sym`); without, 0.
/// The layout is sys/sdt.h's; `_.stapsdt.base` is shared with the `probe` crate's notes.
macro_rules! stapsdt_note {
    ($name:literal, $args:literal) => {
        stapsdt_note!(@ $name, $args, "0")
    };
    ($name:literal, $args:literal, semaphore) => {
        stapsdt_note!(@ $name, $args, "{semaphore}")
    };
    (@ $name:literal, $args:literal, $semaphore:literal) => {
        concat!(
            ".pushsection .note.stapsdt,\"?\",\"note\"\n",
            ".balign 4\n",
            ".4byte 992f-991f, 994f-993f, 3\n",
            "991: .asciz \"stapsdt\"\n",
            "992: .balign 4\n",
            "993: .8byte 990b\n",
            ".8byte _.stapsdt.base\n",
            ".8byte ", $semaphore, "\n",
            ".asciz \"tracer_test\"\n",
            ".asciz \"", $name, "\"\n",
            ".asciz \"", $args, "\"\n",
            "994: .balign 4\n",
            ".popsection\n",
            ".ifndef _.stapsdt.base\n",
            ".pushsection .stapsdt.base,\"aGR\",\"progbits\",.stapsdt.base,comdat\n",
            ".weak _.stapsdt.base\n",
            ".hidden _.stapsdt.base\n",
            "_.stapsdt.base: .space 1\n",
            ".size _.stapsdt.base, 1\n",
            ".popsection\n",
            ".endif\n",
        )
    };
}

/// A probe site: label `990`, a `nop` for the uprobe, and its note.
macro_rules! probe_site {
    ($name:literal, $args:literal $(, $semaphore:ident)?) => {
        concat!("990: nop\n", stapsdt_note!($name, $args $(, $semaphore)?))
    };
}

static MEM_U32: u32 = 0xffff_fffe;
static MEM_I16: [i16; 4] = [0x1111, 0x2222, 0x3333, -32767];
static MEM_U8: [u8; 4] = [1, 2, 3, 0x80];
static IDX_I32: [i32; 8] = [0, 1, 2, 3, 4, -123_456, 6, 7];
static IDX_U64: [u64; 4] = [0, 1, 2, 0x0102_0304_0506_0708];
static IDX_I16: [i16; 8] = [0, 1, 2, -3003, 4, 5, 6, 7];
static IDX_U8: [u8; 8] = [0, 1, 2, 3, 4, 5, 0xf6, 7];
static MULTI_3: i64 = 103;

/// A semaphore on a page of its own, so that `.probes` starts on a fresh page: see
/// `probes`' crate docs for why a semaphore sharing the file page where lld ends the RELRO
/// segment is missed by the kernel's semaphore counting.
#[repr(C, align(4096))]
struct PageAlignedSemaphore(u16);

/// The semaphore of `guarded`: tracers raise it while attached.
#[unsafe(link_section = ".probes")]
static mut GUARDED_SEMAPHORE: PageAlignedSemaphore = PageAlignedSemaphore(0);

fn guarded_semaphore() -> u16 {
    // SAFETY: the address is valid and aligned; the counter is only written by tracers
    // (the kernel or /proc/PID/mem), hence the volatile read and no reference.
    unsafe { read_volatile(addr_of!(GUARDED_SEMAPHORE.0)) }
}

// SAFETY (all asm blocks below): the code executes a `nop` with the given registers, and
// restores everything else it changes (%rsp, %rbp, %rbx) before it ends; the notes go to
// a non-allocated section.

#[inline(never)]
fn fire_noargs() {
    // SAFETY: see above.
    unsafe {
        asm!(
            probe_site!("noargs", ""),
            options(att_syntax, nostack, preserves_flags)
        );
    }
}

#[inline(never)]
fn fire_consts() {
    // SAFETY: see above.
    unsafe {
        asm!(
            probe_site!("consts", "-4@$-5 8@$42 1@$255"),
            options(att_syntax, nostack, preserves_flags)
        );
    }
}

#[inline(never)]
fn fire_regs() {
    // SAFETY: see above.
    unsafe {
        asm!(
            probe_site!("regs", "8@%rdi -4@%esi 2@%dx -1@%cl 8@%r8 -8@%r9"),
            in("rdi") 0xdead_beef_cafe_f00d_u64,
            in("rsi") 0x1234_5678_ffff_fff9_u64,
            in("rdx") 0x1111_2222_3333_beef_u64,
            in("rcx") 0xaaaa_bbbb_cccc_ddfe_u64,
            in("r8") 1_u64,
            in("r9") -1_i64,
            options(att_syntax, nostack, preserves_flags)
        );
    }
}

#[inline(never)]
fn fire_mem() {
    // SAFETY: see above; the 32 bytes written are below the stack pointer of the asm block,
    // which may use the stack (no `nostack`).
    unsafe {
        asm!(
            "push %rbp",
            "mov %rsp, %rbp",
            "sub $32, %rsp",
            "mov %rdi, -16(%rbp)",
            "mov %rsi, 8(%rsp)",
            probe_site!("mem", "-8@-16(%rbp) 8@8(%rsp) 4@(%rax) -2@6(%rdx) -1@-1(%rcx)"),
            "mov %rbp, %rsp",
            "pop %rbp",
            in("rdi") -1_234_567_890_123_i64,
            in("rsi") 0x0123_4567_89ab_cdef_u64,
            in("rax") addr_of!(MEM_U32),
            in("rdx") MEM_I16.as_ptr(),
            in("rcx") MEM_U8.as_ptr().wrapping_add(MEM_U8.len()),
            options(att_syntax)
        );
    }
}

#[inline(never)]
fn fire_indexed() {
    // SAFETY: see above.
    unsafe {
        asm!(
            probe_site!(
                "indexed",
                "-4@8(%rax,%rcx,4) 8@(%rdx,%rcx,8) -2@-2(%rsi,%rdi,2) 1@(%r8,%r9,1)"
            ),
            in("rax") IDX_I32.as_ptr(),
            in("rdx") IDX_U64.as_ptr(),
            in("rsi") IDX_I16.as_ptr(),
            in("r8") IDX_U8.as_ptr(),
            in("rcx") 3_u64,
            in("rdi") 4_u64,
            in("r9") 6_u64,
            options(att_syntax, nostack, preserves_flags)
        );
    }
}

#[inline(never)]
fn fire_twelve() {
    // SAFETY: see above.
    unsafe {
        asm!(
            probe_site!(
                "twelve",
                "-8@%rdi 8@$2 -4@%esi -8@%rdx 8@$5 -8@%rcx -8@%r8 4@$8 -8@%r9 -8@%r10 2@%r11w -8@%rax"
            ),
            in("rdi") 1_u64,
            in("rsi") 0xffff_ffff_0000_0003_u64,
            in("rdx") 4_u64,
            in("rcx") 6_u64,
            in("r8") 7_u64,
            in("r9") 9_u64,
            in("r10") 10_u64,
            in("r11") 0xffff_ffff_ffff_000b_u64,
            in("rax") 12_u64,
            options(att_syntax, nostack, preserves_flags)
        );
    }
}

#[inline(never)]
fn fire_signs() {
    const PATTERN: u64 = 0x8081_8283_8485_8687;
    // SAFETY: see above.
    unsafe {
        asm!(
            probe_site!("signs", "1@%dil -1@%sil 2@%dx -2@%cx 4@%r8d -4@%r9d 8@%r10 -8@%r11"),
            in("rdi") PATTERN,
            in("rsi") PATTERN,
            in("rdx") PATTERN,
            in("rcx") PATTERN,
            in("r8") PATTERN,
            in("r9") PATTERN,
            in("r10") PATTERN,
            in("r11") PATTERN,
            options(att_syntax, nostack, preserves_flags)
        );
    }
}

#[inline(never)]
fn fire_subregs() {
    // SAFETY: see above; %rbx is pushed and popped (it cannot be an asm operand).
    unsafe {
        asm!(
            "push %rbx",
            "movabs $0xbbbbbbbbbbbb0002, %rbx",
            probe_site!(
                "subregs",
                "1@%al 2@%bx 4@%ecx 1@%dl 2@%si 4@%edi 1@%r8b 2@%r9w 4@%r10d 1@%r11b 2@%r12w 4@%r13d"
            ),
            "pop %rbx",
            in("rax") 0xaaaa_aaaa_aaaa_aa01_u64,
            in("rcx") 0xcccc_cccc_0000_0003_u64,
            in("rdx") 0xdddd_dddd_dddd_dd04_u64,
            in("rsi") 0x5555_5555_5555_0005_u64,
            in("rdi") 0x7777_7777_0000_0006_u64,
            in("r8") 0x8888_8888_8888_8807_u64,
            in("r9") 0x9999_9999_9999_0008_u64,
            in("r10") 0x1010_1010_0000_0009_u64,
            in("r11") 0x1111_1111_1111_110a_u64,
            in("r12") 0x1212_1212_1212_000b_u64,
            in("r13") 0x1313_1313_0000_000c_u64,
            options(att_syntax, preserves_flags)
        );
    }
}

#[inline(never)]
fn fire_fullregs() {
    // SAFETY: see above; %rbx and %rbp are pushed and popped (they cannot be asm operands).
    unsafe {
        asm!(
            "push %rbx",
            "push %rbp",
            "mov $-1001, %rbx",
            "mov $-1002, %rbp",
            probe_site!("fullregs", "-8@%rbx -8@%rbp -8@%r12 -8@%r13 -8@%r14 -8@%r15"),
            "pop %rbp",
            "pop %rbx",
            in("r12") -1003_i64,
            in("r13") -1004_i64,
            in("r14") -1005_i64,
            in("r15") -1006_i64,
            options(att_syntax, preserves_flags)
        );
    }
}

#[inline(never)]
fn fire_multi_site_1() {
    // SAFETY: see above.
    unsafe {
        asm!(
            probe_site!("multi", "-4@$1 -8@%rdi"),
            in("rdi") 101_u64,
            options(att_syntax, nostack, preserves_flags)
        );
    }
}

#[inline(never)]
fn fire_multi_site_2() {
    // SAFETY: see above.
    unsafe {
        asm!(
            probe_site!("multi", "-4@$2 -8@%rsi"),
            in("rsi") 102_u64,
            options(att_syntax, nostack, preserves_flags)
        );
    }
}

#[inline(never)]
fn fire_multi_site_3() {
    // SAFETY: see above.
    unsafe {
        asm!(
            probe_site!("multi", "-4@$3 -8@(%rax)"),
            in("rax") addr_of!(MULTI_3),
            options(att_syntax, nostack, preserves_flags)
        );
    }
}

/// Fires `guarded` if its semaphore is raised; returns whether it did.
#[inline(never)]
fn fire_guarded() -> bool {
    if guarded_semaphore() == 0 {
        return false;
    }
    // SAFETY: see above; `semaphore` is only referenced by address in the note.
    unsafe {
        asm!(
            probe_site!("guarded", "-8@%rdi -4@$-1", semaphore),
            semaphore = sym GUARDED_SEMAPHORE,
            in("rdi") 7777_u64,
            options(att_syntax, nostack, preserves_flags)
        );
    }
    true
}

const USAGE: &str = "usage: usdt-args [--loops N] [--interval-ms I] [--wait-for-signal]";

struct Config {
    loops: u64,
    interval: Duration,
}

impl Config {
    fn from_args(args: &mut Args) -> Result<Self> {
        let mut config = Config {
            loops: 1,
            interval: Duration::ZERO,
        };
        while let Some(flag) = args.next_flag()? {
            match flag.as_str() {
                "--loops" => config.loops = args.value(&flag)?,
                "--interval-ms" => config.interval = Duration::from_millis(args.value(&flag)?),
                "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                _ => bail!("unknown option {flag}\n{USAGE}"),
            }
        }
        Ok(config)
    }
}

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let config = Config::from_args(&mut args)?;
    let at_ready = guarded_semaphore();
    announce_ready(args.wait_for_signal())?;
    let at_start = guarded_semaphore();

    let mut guarded = 0u64;
    for round in 0..config.loops {
        if round > 0 && !config.interval.is_zero() {
            std::thread::sleep(config.interval);
        }
        fire_noargs();
        fire_consts();
        fire_regs();
        fire_mem();
        fire_indexed();
        fire_twelve();
        fire_signs();
        fire_subregs();
        fire_fullregs();
        fire_multi_site_1();
        fire_multi_site_2();
        fire_multi_site_3();
        guarded += u64::from(fire_guarded());
    }

    let n = config.loops;
    let fired = [
        ("noargs", n),
        ("consts", n),
        ("regs", n),
        ("mem", n),
        ("indexed", n),
        ("twelve", n),
        ("signs", n),
        ("subregs", n),
        ("fullregs", n),
        ("multi", 3 * n),
        ("guarded", guarded),
    ]
    .map(|(name, count)| format!(r#""{name}":{count}"#))
    .join(",");
    print_line(&format!(
        concat!(
            r#"{{"pid":{},"loops":{},"fired":{{{}}},"multi_sites":{},"#,
            r#""guarded_semaphore_addr":{},"guarded_semaphore_at_ready":{},"#,
            r#""guarded_semaphore_at_start":{},"guarded_semaphore":{}}}"#
        ),
        std::process::id(),
        n,
        fired,
        json_array(&[n, n, n]),
        addr_of!(GUARDED_SEMAPHORE) as usize,
        at_ready,
        at_start,
        guarded_semaphore(),
    ))
}
