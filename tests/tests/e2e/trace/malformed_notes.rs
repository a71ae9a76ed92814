//! Malformed USDT notes are never attached silently (issue 12, case 5). Each case is a copy
//! of `usdt-args` with one note's probe address or semaphore patched to somewhere the
//! kernel must not be pointed at: the ELF header (address 0), `.data`, no segment at all,
//! `.text`, an odd address, `.bss` past the pages mapped from the file. For each, `tracer
//! trace`, by path and with `--pid`:
//! - with the probe named literally, fails, naming the file, the note's offset, the probe
//!   and what is wrong, and leaves the target untouched;
//! - with a wildcard, warns about that site, attaches the others (which are traced), and
//!   leaves the bad address untouched.
//!
//! And with `--pid`, a shared library whose notes are malformed is reported as such, not
//! as "no probes match".

use std::{
    collections::HashMap,
    os::unix::fs::{FileExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::common::*;
use object::{Object as _, ObjectSection as _, ObjectSegment as _, SegmentFlags, elf};

const PAGE: u64 = 4096;

/// Where a note of `tracer_test` is in a file: its header, and its descriptor's three
/// address words (pc, base, semaphore).
struct NoteAt {
    header: usize,
    desc: usize,
}

fn find_note(file: &[u8], name: &str) -> NoteAt {
    let needle = format!("tracer_test\0{name}\0");
    let hits: Vec<usize> = file
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle.as_bytes())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hits.len(), 1, "one note tracer_test:{name}");
    let desc = hits[0] - 24;
    assert_eq!(&file[desc - 8..desc], b"stapsdt\0", "the note's owner");
    NoteAt {
        header: desc - 20,
        desc,
    }
}

fn put_word(file: &mut [u8], at: usize, value: u64) {
    file[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// What the cases need to know of usdt-args' layout (link-time addresses).
struct Layout {
    data: u64,
    text: u64,
    /// Past every segment.
    nowhere: u64,
    /// The first `.bss` page that is not the file's: anonymous memory.
    anonymous_bss: Option<u64>,
    /// `(vaddr, filesz, offset)` of each PT_LOAD, to find the file offset of an address.
    loads: Vec<(u64, u64, u64)>,
}

impl Layout {
    fn of(file: &[u8]) -> Layout {
        let elf = object::File::parse(file).unwrap();
        assert_eq!(
            elf.kind(),
            object::ObjectKind::Dynamic,
            "usdt-args is a PIE"
        );
        let section = |name| elf.section_by_name(name).unwrap().address();
        let mut loads = Vec::new();
        let mut end = 0;
        let mut anonymous_bss = None;
        for segment in elf.segments() {
            let (offset, filesz) = segment.file_range();
            let (vaddr, memsz) = (segment.address(), segment.size());
            loads.push((vaddr, filesz, offset));
            end = end.max(vaddr + memsz);
            let writable = matches!(
                segment.flags(),
                SegmentFlags::Elf { p_flags } if p_flags & elf::PF_W != 0
            );
            let past_file = (vaddr + filesz).next_multiple_of(PAGE);
            if writable && past_file + 2 <= vaddr + memsz {
                anonymous_bss = Some(past_file);
            }
        }
        assert_eq!(loads[0].0, 0, "the first segment maps the ELF header at 0");
        Layout {
            data: section(".data"),
            text: section(".text"),
            nowhere: end.next_multiple_of(0x10000) + 0x10000,
            anonymous_bss,
            loads,
        }
    }

    fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.loads
            .iter()
            .find(|&&(start, filesz, _)| vaddr >= start && vaddr - start < filesz)
            .map(|&(start, _, offset)| vaddr - start + offset)
    }
}

/// One malformed copy: the note of `probe` with its pc or semaphore replaced.
struct Case {
    tag: &'static str,
    probe: &'static str,
    pc: Option<u64>,
    semaphore: Option<u64>,
    /// What the error says is wrong, after the note's name.
    problem: String,
    /// The address the note now points at, which must stay as it is in the target.
    bad_address: u64,
}

fn cases(layout: &Layout, file: &[u8]) -> Vec<Case> {
    let guarded_semaphore = u64::from_le_bytes(
        file[find_note(file, "guarded").desc + 16..][..8]
            .try_into()
            .unwrap(),
    );
    let mut cases = vec![
        Case {
            tag: "pc-zero",
            probe: "noargs",
            pc: Some(0),
            semaphore: None,
            problem: "probe address 0x0 is not code: it is in segment [0x0, ".into(),
            bad_address: 0,
        },
        Case {
            tag: "pc-in-data",
            probe: "consts",
            pc: Some(layout.data),
            semaphore: None,
            problem: format!("probe address {:#x} is not code", layout.data),
            bad_address: layout.data,
        },
        Case {
            tag: "semaphore-nowhere",
            probe: "guarded",
            pc: None,
            semaphore: Some(layout.nowhere),
            problem: format!("semaphore {:#x} is in no loadable segment", layout.nowhere),
            bad_address: layout.nowhere,
        },
        Case {
            tag: "semaphore-in-text",
            probe: "guarded",
            pc: None,
            semaphore: Some(layout.text),
            problem: format!("semaphore {:#x} is in segment [", layout.text),
            bad_address: layout.text,
        },
        Case {
            tag: "semaphore-misaligned",
            probe: "guarded",
            pc: None,
            semaphore: Some(guarded_semaphore + 1),
            problem: format!(
                "semaphore {:#x} is not 2-byte aligned",
                guarded_semaphore + 1
            ),
            bad_address: guarded_semaphore + 1,
        },
    ];
    match layout.anonymous_bss {
        Some(bss) => cases.push(Case {
            tag: "semaphore-in-bss",
            probe: "guarded",
            pc: None,
            semaphore: Some(bss),
            problem: format!("semaphore {bss:#x} is in the zero-filled part of segment ["),
            bad_address: bss,
        }),
        None => eprintln!("usdt-args has no .bss page past its file pages; case skipped"),
    }
    cases
}

/// A runnable copy of usdt-args with `case`'s note patched, and the note's header offset.
fn patched_copy(case: &Case) -> (PathBuf, u64) {
    let mut file = std::fs::read(USDT_ARGS).unwrap();
    let note = find_note(&file, case.probe);
    if let Some(pc) = case.pc {
        put_word(&mut file, note.desc, pc);
    }
    if let Some(semaphore) = case.semaphore {
        put_word(&mut file, note.desc + 16, semaphore);
    }
    let dir = out_dir(&format!("malformed-{}", case.tag));
    let patched = dir.join("patched");
    std::fs::create_dir_all(&patched).unwrap();
    let source = patched.join("usdt-args");
    std::fs::write(&source, &file).unwrap();
    std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = executable_copy(source.to_str().unwrap(), &dir);
    (copy.canonicalize().unwrap(), note.header as u64)
}

/// Bytes of a target at the addresses where a tracer must not write: the bad address
/// itself (if mapped) and every mapping of its file offset (where the kernel puts a
/// uprobe's breakpoint, or counts a semaphore).
struct Untouched {
    pid: u32,
    bytes: Vec<(u64, [u8; 2])>,
}

impl Untouched {
    fn record(pid: u32, layout: &Layout, vaddr: u64) -> Untouched {
        let maps = exe_mappings(pid);
        let bias = maps
            .iter()
            .find(|m| m.2 == 0)
            .expect("the header's mapping")
            .0;
        let mut addresses = vec![bias + vaddr];
        if let Some(offset) = layout.file_offset(vaddr) {
            addresses.extend(
                maps.iter()
                    .filter(|m| m.2 <= offset && offset < m.2 + (m.1 - m.0))
                    .map(|m| m.0 + offset - m.2),
            );
        }
        let mut untouched = Untouched {
            pid,
            bytes: Vec::new(),
        };
        for address in addresses {
            if let Some(bytes) = untouched.read(address) {
                untouched.bytes.push((address, bytes));
            }
        }
        untouched
    }

    fn read(&self, address: u64) -> Option<[u8; 2]> {
        let mem = std::fs::File::open(format!("/proc/{}/mem", self.pid)).unwrap();
        let mut bytes = [0; 2];
        mem.read_exact_at(&mut bytes, address).ok().map(|()| bytes)
    }

    fn check(&self, when: &str) {
        for &(address, before) in &self.bytes {
            assert_eq!(
                self.read(address),
                Some(before),
                "{when}: the target's bytes at {address:#x} changed"
            );
        }
    }
}

/// Events of `tracer trace --format json`, counted by probe name.
fn events_by_name(stdout: &str) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    for line in stdout.lines().filter(|l| l.starts_with('{')) {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if let Some(probe) = event["probe"].as_str() {
            *counts
                .entry(probe.rsplit(':').next().unwrap().to_string())
                .or_default() += 1;
        }
    }
    counts
}

fn run_case(case: &Case, layout: &Layout) {
    let (copy, note_offset) = patched_copy(case);
    let copy = copy.to_str().unwrap();
    let expected = format!(
        "malformed note in {copy} at offset {note_offset:#x} (tracer_test:{}): {}",
        case.probe, case.problem
    );

    // Named literally: refused, by path and with --pid; nothing attached, even briefly.
    let target = Target::start(copy, &["--loops", "1"]);
    let pid = target.pid.to_string();
    let sites = ProbeSites::listed_from(target.pid, USDT_ARGS);
    let untouched = Untouched::record(target.pid, layout, case.bad_address);
    let literal_by_path = format!("usdt:{copy}:tracer_test:{}", case.probe);
    let literal_in_process = format!("usdt:*:tracer_test:{}", case.probe);
    // --duration: a tracer that attaches anyway must still end.
    let runs: [&[&str]; 2] = [
        &["trace", &literal_by_path, "--duration", "1s"],
        &[
            "trace",
            "--pid",
            &pid,
            &literal_in_process,
            "--duration",
            "1s",
        ],
    ];
    for args in runs {
        let out = run_tracer(args);
        let stderr = out.stderr.as_str();
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}: {args:?}: {stderr}",
            case.tag
        );
        assert!(
            stderr.contains(&expected),
            "{}: {args:?}: expected {expected:?} in {stderr}",
            case.tag
        );
        assert!(!stderr.contains("Attached"), "{stderr}");
        sites.assert_untouched(&format!("{}: after {args:?}", case.tag));
        untouched.check(&format!("{}: after {args:?}", case.tag));
    }
    drop(target);

    // A wildcard: a warning, the other probes attached and traced, the bad spot untouched.
    for by_pid in [false, true] {
        let target = Target::start(copy, &["--loops", "1"]);
        let pid = target.pid.to_string();
        let sites = ProbeSites::listed_from(target.pid, USDT_ARGS);
        let untouched = Untouched::record(target.pid, layout, case.bad_address);
        let by_path = format!("usdt:{copy}:tracer_test:*");
        let args: Vec<&str> = if by_pid {
            vec![
                "trace",
                "--format",
                "json",
                "--pid",
                &pid,
                "usdt:*:tracer_test:*",
            ]
        } else {
            vec!["trace", "--format", "json", &by_path]
        };
        let tracer = Tracer::start(&args);
        let when = format!("{} (wildcard, by pid: {by_pid})", case.tag);
        assert!(
            tracer.early_stderr.contains("skipped a probe site")
                && tracer.early_stderr.contains(&expected),
            "{when}: expected a warning with {expected:?} in {}",
            tracer.early_stderr
        );
        assert!(
            sites.breakpoints() > 0,
            "{when}: the valid sites are attached"
        );
        untouched.check(&format!("{when}: while attached"));
        target.release();
        let truth = target.finish();
        if !by_pid {
            // SAFETY: kill has no memory preconditions; the pid is our child's.
            unsafe { libc::kill(tracer.pid() as i32, libc::SIGINT) };
        }
        let (ok, out, err) = tracer.finish();
        assert!(ok, "{when}: {err}");
        let events = events_by_name(&out);
        assert_eq!(
            events.get(case.probe),
            None,
            "{when}: the malformed site: {out}"
        );
        for probe in ["regs", "mem", "twelve"] {
            assert_eq!(
                events.get(probe).copied(),
                truth["fired"][probe].as_u64(),
                "{when}: {probe} traced as often as it fired: {out}"
            );
        }
        assert_eq!(events.get("multi"), Some(&3), "{when}: {out}");
    }
}

fn run_named(tag: &str) {
    require_privileged();
    let file = std::fs::read(USDT_ARGS).unwrap();
    let layout = Layout::of(&file);
    match cases(&layout, &file).iter().find(|c| c.tag == tag) {
        Some(case) => run_case(case, &layout),
        None => eprintln!("skipped: no {tag} case for this build of usdt-args"),
    }
}

#[privileged_test]
fn a_probe_at_address_zero_is_refused_not_put_in_the_elf_header() {
    run_named("pc-zero");
}

#[privileged_test]
fn a_probe_in_data_is_refused() {
    run_named("pc-in-data");
}

#[privileged_test]
fn a_semaphore_in_no_segment_is_refused() {
    run_named("semaphore-nowhere");
}

#[privileged_test]
fn a_semaphore_in_code_is_refused() {
    run_named("semaphore-in-text");
}

#[privileged_test]
fn a_misaligned_semaphore_is_refused_as_a_semaphore_problem() {
    run_named("semaphore-misaligned");
}

#[privileged_test]
fn a_semaphore_in_anonymous_bss_is_refused() {
    run_named("semaphore-in-bss");
}

/// `sleep` with `lib` preloaded, once the library is mapped.
struct Preloaded {
    child: std::process::Child,
}

impl Preloaded {
    fn start(lib: &Path) -> Preloaded {
        let child = Command::new("sleep")
            .arg("60")
            .env("LD_PRELOAD", lib)
            .stderr(Stdio::piped())
            .spawn()
            .expect("sleep");
        let maps = format!("/proc/{}/maps", child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&maps)
            .unwrap_or_default()
            .contains(lib.to_str().unwrap())
        {
            assert!(Instant::now() < deadline, "{} never mapped", lib.display());
            std::thread::sleep(Duration::from_millis(10));
        }
        Preloaded { child }
    }
}

impl Drop for Preloaded {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[privileged_test]
fn a_library_with_malformed_notes_is_reported_as_malformed_with_pid() {
    require_privileged();
    let built = compile_target(
        "gcc",
        "src/malformed/usdt-lib.c",
        "libusdt-lib.so",
        &["-shared", "-fPIC"],
    );
    let original = std::fs::read(built).unwrap();
    let note = find_note(&original, "lib_probe");
    let dir = out_dir("malformed-lib");
    // The probe address at 0 (the library's ELF header); then a note whose strings have
    // no terminating NUL, which cannot be decoded at all.
    let mut pc_zero = original.clone();
    put_word(&mut pc_zero, note.desc, 0);
    let mut undecodable = original.clone();
    let strings = note.desc + 24;
    let end = strings + "tracer_test\0lib_probe\0\0".len();
    undecodable[strings..end]
        .iter_mut()
        .filter(|b| **b == 0)
        .for_each(|b| *b = b'x');
    let variants = [
        (
            "libpc-zero.so",
            pc_zero,
            format!(
                "at offset {:#x} (tracer_test:lib_probe): probe address 0x0 is not code",
                note.header
            ),
        ),
        (
            "libundecodable.so",
            undecodable,
            format!("at offset {:#x}: ", note.header),
        ),
    ];
    for (name, bytes, expected) in variants {
        let lib = dir.join(name);
        std::fs::write(&lib, bytes).unwrap();
        let process = Preloaded::start(&lib);
        let pid = process.child.id().to_string();
        for spec in [
            format!("usdt:{name}:tracer_test:lib_probe"),
            "usdt:*:tracer_test:*".to_string(),
        ] {
            let out = run_tracer(&["trace", "--pid", &pid, &spec, "--duration", "1s"]);
            let stderr = out.stderr.as_str();
            assert_eq!(out.status.code(), Some(1), "{name} {spec}: {stderr}");
            assert!(
                stderr.contains("malformed note in ")
                    && stderr.contains(name)
                    && stderr.contains(&expected),
                "{name} {spec}: expected {expected:?} in {stderr}"
            );
            assert!(!stderr.contains("no probes match"), "{stderr}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
