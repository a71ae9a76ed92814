//! `tracer profile --unwind dwarf` against a C program built without frame pointers
//! (`tests/src/nofp/nofp-demo.c`, compiled here with gcc): DWARF unwinding recovers the
//! whole chain main → chain_a → chain_b → chain_c → spin_leaf, frame pointers do not;
//! also for samples taken in the kernel, in a system call made through glibc, and for
//! off-CPU stacks (blocked in nanosleep through glibc). Built the other way round (frame
//! pointers, no unwind tables), the frames DWARF unwinding had to find with frame
//! pointers are marked as such. Code running in a signal handler unwinds through the
//! signal frame to the code the signal interrupted.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use crate::common::*;

const CHAIN: &str = "main;chain_a;chain_b;chain_c;spin_leaf";
const LEAF: &str = "spin_leaf";

/// Compiles nofp-demo once per test run: -O2 without frame pointers, and without sibling
/// calls so that every caller really is on the stack.
fn nofp_demo() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| compile_demo("nofp-demo", &["-fomit-frame-pointer"]))
}

/// nofp-demo the other way round: frame pointers, but no unwind tables for its code.
fn no_unwind_tables_demo() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        compile_demo(
            "no-cfi-demo",
            &[
                "-fno-omit-frame-pointer",
                "-fno-asynchronous-unwind-tables",
                "-fno-unwind-tables",
            ],
        )
    })
}

fn compile_demo(name: &str, flags: &[&str]) -> PathBuf {
    let mut all = vec!["-fno-optimize-sibling-calls"];
    all.extend_from_slice(flags);
    compile_target("gcc", "src/nofp/nofp-demo.c", name, &all)
}

/// Profiles one nofp-demo run (1.5 s; `workload` is `spin`, `read` or `sleep`) with
/// `--unwind METHOD`; returns the tracer's stdout and the on-CPU folded stacks.
/// Everything runs inside a signal handler (on CPU and in 2 ms sleeps): its stacks go
/// through the kernel's signal frame (glibc's `__restore_rt`) down to the interrupted
/// chain from `main`, on CPU and off CPU alike.
#[privileged_test]
fn dwarf_unwinds_through_signal_frames() {
    require_privileged();
    let (out, folded) = profile_view(nofp_demo(), "dwarf", "signal", "wallclock");
    let mut handler = 0;
    let mut through = 0;
    let mut blocked_through = 0;
    for line in folded.lines() {
        let (stack, weight) = line.rsplit_once(' ').unwrap();
        let weight: u64 = weight.parse().unwrap();
        if !stack.contains("handler_leaf") {
            continue;
        }
        handler += weight;
        if stack.contains(&format!("{CHAIN};")) && stack.contains("_start") {
            through += weight;
            blocked_through += weight * u64::from(stack.ends_with("[off-cpu]"));
        }
    }
    eprintln!("{out}");
    assert!(
        handler > 1_000_000,
        "too little time in the handler:\n{folded}"
    );
    assert!(
        through * 100 >= handler * 95,
        "only {through} of {handler} us in the handler reach main through the signal frame\n{folded}"
    );
    assert!(blocked_through > 300_000, "blocked time too:\n{folded}");
}

fn profile(method: &str, workload: &str) -> (String, String) {
    profile_view(nofp_demo(), method, workload, "oncpu")
}

/// Like [`profile`], for `binary`, returning the folded stacks of `view`.
fn profile_view(binary: &Path, method: &str, workload: &str, view: &str) -> (String, String) {
    let name = binary.file_name().unwrap().to_str().unwrap();
    let dir = out_dir(&format!("unwind-{name}-{method}-{workload}"));
    let target = Target::start(binary.to_str().unwrap(), &["1500", workload]);
    let tracer = TracerRun::profile()
        .pid(target.pid)
        .args(["--frequency", "499", "--unwind", method])
        .out(&dir)
        .start();
    target.release();
    target.finish();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "tracer failed: {err}");
    assert!(err.contains("target exited"), "{err}");
    let folded = std::fs::read_to_string(dir.join(format!("{view}.folded"))).unwrap();
    (out, folded)
}

/// (weight of the stacks through spin_leaf, weight of those with the whole chain, the
/// most user frames in a spin_leaf stack), counting only stacks that reached the kernel
/// when `in_kernel`.
fn leaf_stacks(folded: &str, in_kernel: bool) -> (u64, u64, usize) {
    let (mut leaf, mut chain, mut depth) = (0, 0, 0);
    for line in folded.lines() {
        let Some((stack, weight)) = line.rsplit_once(' ') else {
            continue;
        };
        let weight: u64 = weight.parse().unwrap();
        let frames: Vec<&str> = stack.split(';').skip(1).collect();
        if !frames.contains(&LEAF) || (in_kernel && !stack.ends_with("_[k]")) {
            continue;
        }
        leaf += weight;
        if stack.contains(CHAIN) {
            chain += weight;
        }
        depth = depth.max(frames.iter().filter(|f| !f.ends_with("_[k]")).count());
    }
    (leaf, chain, depth)
}

#[privileged_test]
fn dwarf_unwinding_recovers_callers_without_frame_pointers() {
    require_privileged();
    let (out, folded) = profile("dwarf", "spin");
    let (leaf, chain, depth) = leaf_stacks(&folded, false);
    eprintln!("--unwind dwarf: deepest spin_leaf stack {depth} user frames\n{out}");
    assert!(leaf > 300_000, "too little spinning sampled:\n{folded}");
    assert!(
        chain * 100 >= leaf * 95,
        "only {chain} of {leaf} us through spin_leaf have the whole chain:\n{folded}"
    );
    assert!(depth >= 5, "{folded}");
    assert!(out.contains("unwound with DWARF"), "{out}");
}

#[privileged_test]
fn frame_pointers_lose_the_callers() {
    require_privileged();
    let (out, folded) = profile("fp", "spin");
    let (leaf, chain, depth) = leaf_stacks(&folded, false);
    eprintln!("--unwind fp: deepest spin_leaf stack {depth} user frames\n{out}");
    assert!(leaf > 300_000, "too little spinning sampled:\n{folded}");
    // The proof that the dwarf test can fail: this target's callers are out of reach
    // of a frame-pointer walk.
    assert_eq!(chain, 0, "{folded}");
    assert!(!folded.contains("chain_b;chain_c"), "{folded}");
    assert!(!out.contains("unwound with DWARF"), "{out}");
    assert!(
        !folded.contains(" [fp]"),
        "nothing to tell apart:\n{folded}"
    );
}

#[privileged_test]
fn dwarf_unwinds_samples_taken_in_system_calls() {
    require_privileged();
    // Samples in the kernel unwind from the user registers saved at kernel entry, through
    // glibc's read (no frame pointers either).
    let (out, folded) = profile("dwarf", "read");
    let (leaf, chain, depth) = leaf_stacks(&folded, true);
    eprintln!("--unwind dwarf, in read(2): deepest stack {depth} user frames\n{out}");
    assert!(
        leaf > 200_000,
        "too little time in the kernel sampled:\n{folded}"
    );
    assert!(
        chain * 100 >= leaf * 95,
        "only {chain} of {leaf} us in the kernel have the whole chain:\n{folded}"
    );
    let (_, fp_folded) = profile("fp", "read");
    let (_, fp_chain, _) = leaf_stacks(&fp_folded, true);
    let fp_kernel = folded_weight_where(&fp_folded, |stack| stack.ends_with("_[k]"));
    eprintln!("--unwind fp, in read(2): {fp_chain} of {fp_kernel} us in the kernel with the chain");
    assert!(fp_kernel > 200_000, "{fp_folded}");
    assert_eq!(fp_chain, 0, "{fp_folded}");
}

#[privileged_test]
fn dwarf_unwinds_where_threads_block() {
    require_privileged();
    // Off-CPU stacks: where the thread blocked in nanosleep, through glibc.
    let (out, folded) = profile_view(nofp_demo(), "dwarf", "sleep", "offcpu");
    let (leaf, chain, depth) = leaf_stacks(&folded, true);
    eprintln!("--unwind dwarf, off CPU: deepest stack {depth} user frames\n{out}");
    assert!(leaf > 1_000_000, "too little blocked time:\n{folded}");
    assert!(
        chain * 100 >= leaf * 95,
        "only {chain} of {leaf} us blocked have the whole chain:\n{folded}"
    );
    assert!(folded.contains("hrtimer_nanosleep_[k]"), "{folded}");
    let snapshots = out
        .split(" off-CPU snapshots")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no snapshot count in:\n{out}"));
    // ~700 sleeps at one place: the snapshot is taken once the stack changed (and a
    // few times before user space first unwound it), then reused.
    assert!(
        (1..=30).contains(&snapshots),
        "{snapshots} snapshots:\n{out}"
    );
    let (_, fp_folded) = profile_view(nofp_demo(), "fp", "sleep", "offcpu");
    let (fp_leaf, fp_chain, _) = leaf_stacks(&fp_folded, true);
    eprintln!("--unwind fp, off CPU: {fp_chain} of {fp_leaf} us blocked with the chain");
    assert_eq!(fp_chain, 0, "{fp_folded}");
}

#[privileged_test]
fn frames_found_by_frame_pointers_are_marked() {
    require_privileged();
    let (out, folded) = profile_view(no_unwind_tables_demo(), "dwarf", "spin", "oncpu");
    eprintln!("--unwind dwarf, no unwind tables:\n{out}");
    // No function of the demo has call frame information: their callers were found
    // through the frame pointer. (Where spin_leaf itself was interrupted, framehop first
    // tries the return address at the stack pointer, which may add an [unknown] frame.)
    let marked = "main [fp];chain_a [fp];chain_b [fp];chain_c [fp];";
    let total = folded_weight_where(&folded, |stack| stack.contains("spin_leaf"));
    let through = folded_weight_where(&folded, |stack| {
        stack.contains("spin_leaf") && stack.contains(marked)
    });
    assert!(total > 300_000, "{folded}");
    assert!(
        through * 100 >= total * 95,
        "{through} of {total} us:\n{folded}"
    );
    assert!(out.contains("found by frame pointers"), "{out}");
    // With unwind tables nothing is marked.
    let (_, nofp_folded) = profile("dwarf", "spin");
    assert!(!nofp_folded.contains("chain_c [fp]"), "{nofp_folded}");
}

#[privileged_test]
fn reused_snapshots_never_mix_up_callers() {
    require_privileged();
    // nap_short (1 ms) and nap_long (3 ms) alternate and block with the same registers:
    // only the return addresses on the stack differ. Reusing a snapshot without checking
    // them would put all the time under one of the two.
    let (out, folded) = profile_view(nofp_demo(), "dwarf", "naps", "offcpu");
    let weight_under = |name: &str| {
        folded_weight_where(&folded, |stack| {
            stack.contains(&format!("spin_leaf;{name};"))
        })
    };
    let (short, long) = (weight_under("nap_short"), weight_under("nap_long"));
    eprintln!("nap_short {short} us, nap_long {long} us\n{out}");
    assert!(short + long > 1_000_000, "{folded}");
    let long_share = long as f64 / (short + long) as f64;
    assert!(
        (0.65..=0.85).contains(&long_share),
        "nap_long has {:.0}% of the naps' time, not ~75%:\n{folded}",
        long_share * 100.0
    );
}
