//! USDT sites made of a nop and a 5-byte nop (what newer SDT headers emit): tracer
//! attaches at the 5-byte nop, where Linux 6.18 runs the uprobe without a trap (it maps a
//! `[uprobes-trampoline]` into the process), counts every hit, decodes the arguments
//! (a global read `%rip`-relative included) and leaves the code as it was.

use crate::common::*;

/// The target built as `name` (one per test: tests run at once, and a file being written
/// cannot be executed).
fn nop5_target(name: &str) -> String {
    compile_target("gcc", "src/nop5/nop5.c", name, &["-fPIE", "-pie"])
        .to_str()
        .unwrap()
        .to_owned()
}

/// The site's note address and the file offset tracer attaches at, from `list -v`.
fn listed_site(bin: &str) -> (u64, u64, String) {
    let out = run_tracer(&["list", "-v", &format!("usdt:{bin}:opt:fired")]);
    let text = out.stdout.clone();
    assert!(out.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("site pc "))
        .unwrap_or_else(|| panic!("{text}"));
    let hex_after = |marker: &str| {
        let rest = &line[line.find(marker).unwrap() + marker.len()..];
        let hex: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
        u64::from_str_radix(&hex, 16).unwrap()
    };
    (hex_after("site pc 0x"), hex_after("file offset 0x"), text)
}

#[test]
fn list_says_the_site_is_attached_at_its_nop5() {
    let bin = nop5_target("nop5-list");
    let (pc, offset, text) = listed_site(&bin);
    assert!(
        text.contains("attached at its 5-byte nop (an optimized uprobe)"),
        "{text}"
    );
    // The file offset is the 5-byte nop's: one past the nop the note names (in this
    // small PIE, text's file offsets equal its addresses).
    assert_eq!(offset, pc + 1, "{text}");
    let file = std::fs::read(&bin).unwrap();
    assert_eq!(
        &file[pc as usize..pc as usize + 6],
        &[0x90, 0x0f, 0x1f, 0x44, 0x00, 0x00]
    );
}

/// The code bytes of the site (the nop and the 5-byte nop) in the running process.
fn site_code(pid: u32, file_offset_of_nop: u64) -> Vec<u8> {
    let (start, _, offset, _) = exe_mappings(pid)
        .into_iter()
        .find(|m| m.2 <= file_offset_of_nop && file_offset_of_nop < m.2 + (m.1 - m.0))
        .expect("the site is mapped");
    let mut code = vec![0u8; 6];
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&mem, &mut code, start + file_offset_of_nop - offset)
        .unwrap();
    code
}

/// Whether this kernel runs uprobes on a 5-byte nop without a trap (Linux 6.18, x86-64).
fn kernel_optimizes_nop5() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (6, 18)
}

#[privileged_test]
fn every_hit_at_an_optimized_site_is_counted_decoded_and_the_code_restored() {
    require_privileged();
    let bin = nop5_target("nop5-trace");
    let (pc, _, _) = listed_site(&bin);
    const HITS: u64 = 20_000;
    let mut target = Target::start(&bin, &[&HITS.to_string()]);
    let pid = target.pid;
    let before = site_code(pid, pc);
    assert_eq!(before, [0x90, 0x0f, 0x1f, 0x44, 0x00, 0x00]);
    let probe = format!("usdt:{bin}:opt:fired");
    let tracer = TracerRun::trace().json().pid(pid).args([&probe]).start();
    target.release();
    // The target fired every hit and waits: its truth, then the tracer stops.
    let truth: serde_json::Value = serde_json::from_str(&target.read_line()).unwrap();
    let attached = site_code(pid, pc);
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGINT) };
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    let events = parse_trace_json(&out).events;
    assert_eq!(events.len() as u64, HITS, "{err}");
    for (i, event) in events.iter().enumerate() {
        let args = event.int_args();
        assert_eq!(args[0], i as i64, "hits in order, the iteration in %rdi");
        assert_eq!(
            args[1] as u64,
            truth["global"].as_u64().unwrap(),
            "{event:?}"
        );
    }
    // The nop the note names is left alone: the uprobe is on the 5-byte nop.
    assert_eq!(attached[0], 0x90, "{attached:x?}");
    assert_ne!(
        attached, before,
        "the 5-byte nop carries the uprobe while attached"
    );
    assert_eq!(
        site_code(pid, pc),
        before,
        "the code is as it was once detached"
    );
    if kernel_optimizes_nop5() {
        assert_eq!(
            truth["trampoline"], true,
            "Linux 6.18 maps [uprobes-trampoline] for an optimized uprobe: {truth}"
        );
    } else {
        println!("skipped the trampoline check: this kernel runs every uprobe as a trap");
    }
}

#[privileged_test]
fn bpftrace_counts_the_same_hits_at_the_nop() {
    require_privileged();
    let bin = nop5_target("nop5-bpftrace");
    let probe = format!("usdt:{bin}:opt:fired");
    let ours = run_tracer(&["trace", "--count", &probe, "--", &bin, "3000"]);
    let text = ours.stdout.as_str();
    assert!(ours.status.success(), "{}", ours.stderr.as_str());
    assert!(text.contains(&format!("@[{probe}]: 3000")), "{text}");
    let script = format!("{probe} {{ @hits = count(); }}");
    let theirs = std::process::Command::new("bpftrace")
        .args(["-e", &script, "-c", &format!("{bin} 3000")])
        .output()
        .unwrap();
    let maps = BpftraceMaps::parse(&String::from_utf8_lossy(&theirs.stdout));
    assert_eq!(
        maps.int("hits"),
        3000,
        "{}",
        String::from_utf8_lossy(&theirs.stderr)
    );
}
