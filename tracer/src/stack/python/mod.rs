//! Python frames in every stack of a CPython process.
//!
//! A process whose mappings hold a CPython interpreter (a `python3.X` executable or a
//! `libpython3.X.so`) gets an [`Interpreter`]: where its thread states are and how its
//! structures are laid out ([`layout`]). The kernel walks a thread's frame chain wherever
//! it takes a user stack snapshot and sends each frame's code object and instruction;
//! threads read from /proc are walked here the same way ([`Interpreter::thread_stack`]).
//! Code objects are read from `/proc/PID/mem` and named `qualname (file.py:LINE)`
//! ([`lines`], [`objects`]), once per code object and line. Each native
//! `_PyEval_EvalFrameDefault` frame of the unwound stack is then replaced by the Python
//! frames it was running ([`merge`]), so C code called from Python stays between its
//! Python caller and what it called.
//!
//! A named Python frame travels through the address-based stack pipeline as a
//! [`crate::stack::frame_tokens`] token.

pub(crate) mod layout;
pub(crate) mod lines;
pub(crate) mod objects;

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::rc::Rc;

use tracer_common::python::{
    MAX_PYTHON_FRAMES, MAX_PYTHON_THREADS, NO_FIELD, PythonProcess, PythonStack, boundary,
};

use self::layout::Layout;
use crate::stack::elf::ElfSymbols;
use crate::stack::frame_tokens;
use crate::stack::symbolize::ProcessMaps;
use crate::stack::unwind::{StackMerger, UnwoundStack};

/// The module Python frames are shown with.
pub(crate) const MODULE: &str = "[python]";

/// One thread's Python frames, innermost first, cut into the groups each native
/// `_PyEval_EvalFrameDefault` call ran.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PythonFrames {
    /// (code object address, raw instruction field) of each frame.
    pub frames: Vec<(u64, u64)>,
    /// For each frame: whether it is the outermost of its native call.
    pub outermost: Vec<bool>,
    /// The chain went on beyond what was read.
    pub truncated: bool,
}

impl PythonFrames {
    /// The frames the kernel sent with a snapshot.
    pub(crate) fn from_kernel(stack: &PythonStack) -> Self {
        let count = (stack.count as usize).min(MAX_PYTHON_FRAMES);
        Self {
            frames: stack.frames[..count]
                .iter()
                .map(|f| (f.code, f.instr))
                .collect(),
            outermost: (0..count)
                .map(|i| stack.boundaries & (1 << i) != 0)
                .collect(),
            truncated: stack.truncated != 0,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }
}

/// The CPython interpreters of the processes a run has seen, found once per process.
#[derive(Debug, Default)]
pub(crate) struct Interpreters {
    /// `None`: the process runs no interpreter the tracer reads.
    by_process: HashMap<u32, Option<Interpreter>>,
    /// Processes forked from another without executing since, by the one they copy.
    forked_from: HashMap<u32, u32>,
    /// Python frames are not wanted: no interpreter is looked for.
    disabled: bool,
}

impl Interpreters {
    /// Interpreters never looked for (`--no-python-frames`, or frame-pointer unwinding).
    pub(crate) fn disabled() -> Self {
        Self {
            disabled: true,
            ..Self::default()
        }
    }

    /// Process `child` forked from `parent` and runs its copy of the program: once it
    /// exited, its code objects are read from its parent, where they are at the same
    /// addresses (a short-lived worker's frames are named after it is gone).
    /// Forgets the interpreters of processes `tgids`.
    pub(crate) fn forget(&mut self, tgids: &std::collections::HashSet<u32>) {
        self.by_process.retain(|tgid, _| !tgids.contains(tgid));
        self.forked_from.retain(|child, _| !tgids.contains(child));
    }

    /// Process `tgid` mapped code or started a program: if it ran no interpreter, it is
    /// looked at again (a shell that executes Python).
    pub(crate) fn remapped(&mut self, tgid: u32) {
        if let Some(None) = self.by_process.get(&tgid) {
            self.by_process.remove(&tgid);
        }
    }

    pub(crate) fn note_fork(&mut self, child: u32, parent: u32) {
        self.forked_from.insert(child, parent);
    }

    /// The interpreter of process `tgid`, looked for in `maps` the first time (a version
    /// the tracer cannot read is said then, once).
    pub(crate) fn find(
        &mut self,
        tgid: u32,
        maps: Option<&ProcessMaps>,
    ) -> Option<&mut Interpreter> {
        if self.disabled {
            return None;
        }
        // A fork's interpreter is its parent's, at the same addresses: known so even
        // when the fork is gone before it is looked at.
        if !self.by_process.contains_key(&tgid)
            && let Some(forked) = self
                .forked_from
                .get(&tgid)
                .and_then(|parent| self.by_process.get(parent))
                .and_then(Option::as_ref)
                .map(|parent| parent.forked(tgid))
        {
            self.by_process.insert(tgid, Some(forked));
        }
        let found = match self.by_process.entry(tgid) {
            std::collections::hash_map::Entry::Occupied(known) => known.into_mut(),
            std::collections::hash_map::Entry::Vacant(new) => {
                let mut found = Interpreter::find(maps?).unwrap_or_else(|why| {
                    crate::status!("tracer: process {tgid}: no Python frames: {why}");
                    None
                });
                if let Some(interpreter) = found.as_mut() {
                    interpreter.copy_of = self
                        .forked_from
                        .get(&tgid)
                        .copied()
                        .filter(|&parent| parent != interpreter.pid);
                }
                new.insert(found)
            }
        };
        found.as_mut()
    }

    /// The interpreters ready for the kernel to walk that it has not been told of yet,
    /// by process (see [`Interpreter::kernel_process`]).
    pub(crate) fn ready_for_kernel(&mut self) -> Vec<(u32, PythonProcess)> {
        self.by_process
            .iter_mut()
            .filter_map(|(&tgid, found)| Some((tgid, found.as_mut()?.kernel_process()?)))
            .collect()
    }

    /// Closes the memory of every interpreter not read since the last call: the
    /// descriptors held stay as few as the processes being named.
    pub(crate) fn close_idle(&mut self) {
        for interpreter in self.by_process.values().flatten() {
            if !interpreter.used.replace(false) {
                interpreter.mem.borrow_mut().take();
                interpreter.copy_mem.borrow_mut().take();
            }
        }
    }
}

/// What the tracer knows of a process's CPython interpreter.
#[derive(Debug)]
pub(crate) struct Interpreter {
    pub version: (u8, u8),
    layout: Layout,
    /// Where `_PyRuntime` is in the process.
    runtime: u64,
    pid: u32,
    /// The process's memory, opened when read and closed when idle (see
    /// [`Interpreters::close_idle`]): a run that sees many processes keeps no
    /// descriptor of those that are done.
    mem: std::cell::RefCell<Option<File>>,
    /// Whether `mem` was read since the last [`Interpreters::close_idle`].
    used: std::cell::Cell<bool>,
    /// The process this one forked from without executing since: what its own memory,
    /// once it exited, no longer gives is read there.
    copy_of: Option<u32>,
    /// That process's memory, opened as `mem` is.
    copy_mem: std::cell::RefCell<Option<File>>,
    /// What the kernel is told, once the interpreter is initialized.
    kernel: Option<PythonProcess>,
    /// Whether the kernel has been told.
    registered: bool,
    /// Where `_PyEval_EvalFrameDefault` (and its cold part) lie in the process.
    eval_ranges: Vec<Range<u64>>,
    codes: HashMap<u64, Option<Rc<Code>>>,
    /// Tokens by code object and instruction.
    frame_tokens: HashMap<(u64, u64), u64>,
}

/// Reads `buf.len()` bytes at `addr` of process `pid`'s memory, `mem` opened if it is
/// not.
fn read_memory(
    mem: &std::cell::RefCell<Option<File>>,
    pid: u32,
    addr: u64,
    buf: &mut [u8],
) -> Option<()> {
    let mut mem = mem.borrow_mut();
    if mem.is_none() {
        *mem = File::open(format!("/proc/{pid}/mem")).ok();
    }
    mem.as_ref()?.read_exact_at(buf, addr).ok()
}

/// What naming a code object's frames needs.
#[derive(Debug)]
struct Code {
    /// `co_qualname` where the version has it, else `co_name`.
    name: String,
    /// `co_filename` as shown: its last component (two for a package's `__init__.py`).
    file: String,
    first_line: u32,
    linetable: Vec<u8>,
}

/// Tokens kept per interpreter before the table starts over (a long run of generated
/// code would otherwise grow it without bound).
const MAX_FRAME_TOKENS: usize = 1 << 18;

/// Bytes read of a string or bytes object at most.
const MAX_OBJECT_BYTES: usize = 1 << 20;

impl Interpreter {
    /// This interpreter as the fork `child` has it: the same layout and addresses, its
    /// memory read first, this process's once it is gone.
    fn forked(&self, child: u32) -> Self {
        Self {
            version: self.version,
            layout: self.layout,
            runtime: self.runtime,
            pid: child,
            mem: std::cell::RefCell::new(None),
            used: std::cell::Cell::new(true),
            copy_of: Some(self.pid),
            copy_mem: std::cell::RefCell::new(None),
            // The kernel was told at the fork (`PYTHON_PROCESSES` follows forks).
            kernel: self.kernel,
            registered: true,
            eval_ranges: self.eval_ranges.clone(),
            codes: self.codes.clone(),
            frame_tokens: HashMap::new(),
        }
    }

    /// The interpreter of the process `maps` was captured from, if it runs CPython of a
    /// version the tracer can read. An interpreter not initialized yet is returned all
    /// the same: [`Interpreter::kernel_process`] says when it is.
    pub(crate) fn find(maps: &ProcessMaps) -> Result<Option<Self>, String> {
        let pid = maps.pid();
        let mut seen = Vec::new();
        for mapping in maps.mapped_files() {
            let file_name = mapping.path.rsplit('/').next().unwrap_or_default();
            let candidate = file_name.starts_with("libpython3") || file_name.starts_with("python3");
            if !candidate || seen.contains(&mapping.path) {
                continue;
            }
            seen.push(mapping.path);
            let Some(file) = mapping.file else {
                continue;
            };
            let Some(symbols) = ElfSymbols::read(file, &INTERPRETER_SYMBOLS) else {
                continue;
            };
            let Some(runtime) = symbols.address("_PyRuntime") else {
                continue;
            };
            let Some(bias) = symbols.load_bias(mapping.start, mapping.offset) else {
                continue;
            };
            let mem = File::open(format!("/proc/{pid}/mem")).map_err(|e| e.to_string())?;
            let version = match symbols.address("Py_Version") {
                Some(at) => {
                    let mut word = [0u8; 4];
                    mem.read_exact_at(&mut word, bias.wrapping_add(at))
                        .map_err(|e| format!("reading Py_Version: {e}"))?;
                    let hex = u32::from_le_bytes(word);
                    ((hex >> 24) as u8, (hex >> 16) as u8)
                }
                None => version_from_file_name(file_name)
                    .ok_or_else(|| format!("cannot tell the Python version of {file_name}"))?,
            };
            // From 3.13 the interpreter describes its own structures at the start of
            // `_PyRuntime`; the table is the fallback.
            let described = (version >= (3, 13))
                .then(|| {
                    let mut bytes = vec![0u8; layout::DEBUG_OFFSETS_SIZE_3_13];
                    mem.read_exact_at(&mut bytes, bias.wrapping_add(runtime))
                        .ok()?;
                    layout::layout_from_debug_offsets(&bytes)
                })
                .flatten();
            log::debug!(
                "process {pid}: CPython {}.{}, layout from {}",
                version.0,
                version.1,
                match described {
                    Some(_) => "its _Py_DebugOffsets",
                    None => "the table",
                }
            );
            let Some(layout) = described.or_else(|| layout::layout(version.0, version.1)) else {
                return Err(format!(
                    "CPython {}.{} is not supported (3.9 to 3.13 are): stacks keep the \
                     interpreter's native frames",
                    version.0, version.1
                ));
            };
            let eval_ranges = symbols
                .found
                .iter()
                .filter(|(name, _, _)| name.starts_with("_PyEval_EvalFrameDefault"))
                .map(|&(_, at, size)| bias.wrapping_add(at)..bias.wrapping_add(at + size.max(1)))
                .collect();
            let mut interpreter = Self {
                version,
                layout,
                runtime: bias.wrapping_add(runtime),
                pid,
                mem: std::cell::RefCell::new(Some(mem)),
                used: std::cell::Cell::new(true),
                copy_of: None,
                copy_mem: std::cell::RefCell::new(None),
                kernel: None,
                registered: false,
                eval_ranges,
                codes: HashMap::new(),
                frame_tokens: HashMap::new(),
            };
            interpreter.initialize();
            return Ok(Some(interpreter));
        }
        Ok(None)
    }

    /// Reads where the main interpreter keeps its thread states, once it has one.
    fn initialize(&mut self) {
        if self.kernel.is_some() {
            return;
        }
        let layout = self.layout;
        let Some(interp) = self.read_u64(self.runtime + layout.runtime_interpreters_head) else {
            return;
        };
        if interp == 0 {
            return;
        }
        let field = |offset: Option<u64>| offset.map_or(NO_FIELD, |o| o as u16);
        let (boundary, cstack_owner) = match (layout.frame_entry, layout.frame_owner) {
            (Some(_), _) => (boundary::ENTRY_FLAG, 0),
            (None, Some(_)) => (boundary::CSTACK_OWNER, layout::FRAME_OWNED_BY_CSTACK),
            (None, None) => (boundary::EVERY_FRAME, 0),
        };
        self.kernel = Some(PythonProcess {
            threads_head: interp + layout.interp_threads_head,
            tstate_next: layout.tstate_next as u16,
            tstate_thread_id: layout.tstate_thread_id as u16,
            tstate_frame: layout.tstate_frame as u16,
            cframe_current_frame: field(layout.cframe_current_frame),
            frame_previous: layout.frame_previous as u16,
            frame_code: layout.frame_code as u16,
            frame_instr: layout.frame_instr as u16,
            frame_entry: field(layout.frame_entry),
            // 3.11 has `owner` too, but marks entries with `is_entry`.
            frame_owner: match boundary {
                boundary::CSTACK_OWNER => field(layout.frame_owner),
                _ => NO_FIELD,
            },
            frame_size: layout.frame_size.min(128) as u16,
            boundary,
            cstack_owner,
            _pad: [0; 2],
        });
    }

    /// What the kernel is to be told of this interpreter, the first time it is ready
    /// (initialized): `None` before, and after it was handed out once.
    pub(crate) fn kernel_process(&mut self) -> Option<PythonProcess> {
        if self.registered {
            return None;
        }
        self.initialize();
        let process = self.kernel?;
        self.registered = true;
        Some(process)
    }

    fn read_u64(&self, addr: u64) -> Option<u64> {
        let mut word = [0u8; 8];
        self.read(addr, &mut word)?;
        Some(u64::from_le_bytes(word))
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Option<()> {
        self.used.set(true);
        if read_memory(&self.mem, self.pid, addr, buf).is_some() {
            return Some(());
        }
        read_memory(&self.copy_mem, self.copy_of?, addr, buf)
    }

    /// The Python frames of the thread whose FS base is `fsbase`, read from the
    /// process's memory (a thread that is blocked, whose frames stay put).
    pub(crate) fn thread_stack(&mut self, fsbase: u64) -> PythonFrames {
        let mut stack = PythonFrames::default();
        self.initialize();
        let (Some(process), true) = (self.kernel, fsbase != 0) else {
            return stack;
        };
        let layout = self.layout;
        let mut tstate = self.read_u64(process.threads_head).unwrap_or(0);
        for _ in 0..MAX_PYTHON_THREADS {
            if tstate == 0 || self.read_u64(tstate + layout.tstate_thread_id) == Some(fsbase) {
                break;
            }
            tstate = self.read_u64(tstate + layout.tstate_next).unwrap_or(0);
        }
        if tstate == 0 {
            return stack;
        }
        let mut frame = self.read_u64(tstate + layout.tstate_frame).unwrap_or(0);
        if let Some(current) = layout.cframe_current_frame
            && frame != 0
        {
            frame = self.read_u64(frame + current).unwrap_or(0);
        }
        let mut bytes = [0u8; 128];
        let size = (process.frame_size as usize).min(bytes.len());
        for _ in 0..MAX_PYTHON_FRAMES + 8 {
            if frame == 0 {
                break;
            }
            if stack.frames.len() >= MAX_PYTHON_FRAMES {
                stack.truncated = true;
                break;
            }
            if self.read(frame, &mut bytes[..size]).is_none() {
                break;
            }
            let word = |offset: u64| {
                let at = offset as usize;
                bytes
                    .get(at..at + 8)
                    .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
            };
            let byte = |offset: u64| bytes.get(offset as usize).copied().unwrap_or(0);
            let previous = word(layout.frame_previous);
            if process.boundary == boundary::CSTACK_OWNER
                && byte(u64::from(process.frame_owner)) == process.cstack_owner
            {
                if let Some(last) = stack.outermost.last_mut() {
                    *last = true;
                }
                frame = previous;
                continue;
            }
            stack
                .frames
                .push((word(layout.frame_code), word(layout.frame_instr)));
            stack.outermost.push(match process.boundary {
                boundary::EVERY_FRAME => true,
                boundary::ENTRY_FLAG => layout.frame_entry.is_some_and(|at| byte(at) != 0),
                _ => false,
            });
            frame = previous;
        }
        stack
    }

    /// `stack`, of the thread whose FS base is `fsbase`, with its Python frames read
    /// from the process's memory (see [`Interpreter::thread_stack`]).
    pub(crate) fn merge_thread(&mut self, stack: UnwoundStack, fsbase: u64) -> UnwoundStack {
        let python = self.thread_stack(fsbase);
        self.merge(stack, &python)
    }

    /// `stack` with its `_PyEval_EvalFrameDefault` frames replaced by the Python frames
    /// they ran (see [`merge`]).
    fn merge(&mut self, stack: UnwoundStack, python: &PythonFrames) -> UnwoundStack {
        if python.is_empty() {
            return stack;
        }
        let groups = self.name_groups(python);
        let ranges = &self.eval_ranges;
        merge(stack, &groups, |lookup| {
            ranges.iter().any(|range| range.contains(&lookup))
        })
    }

    /// Tokens of `python`'s frames, in one group per native call, innermost first.
    fn name_groups(&mut self, python: &PythonFrames) -> Vec<Vec<u64>> {
        let mut groups = vec![Vec::new()];
        for (&(code, instr), &outermost) in python.frames.iter().zip(&python.outermost) {
            let token = self.frame_token(code, instr);
            groups.last_mut().expect("one group at least").push(token);
            if outermost {
                groups.push(Vec::new());
            }
        }
        if groups.last().is_some_and(Vec::is_empty) {
            groups.pop();
        }
        groups
    }

    /// The token of the frame running `instr` in the code object at `code`.
    fn frame_token(&mut self, code: u64, instr: u64) -> u64 {
        if let Some(&token) = self.frame_tokens.get(&(code, instr)) {
            return token;
        }
        let name = match self.code(code) {
            Some(info) => {
                // A frame that has not started its first instruction is at its first line.
                let line = match lines::instruction_offset(self.version, instr, code, &self.layout)
                {
                    Some(offset) => lines::line_for_offset(
                        self.version,
                        &info.linetable,
                        info.first_line,
                        offset,
                    ),
                    None => Some(info.first_line),
                };
                match line {
                    Some(line) => format!("{} ({}:{line})", info.name, info.file),
                    None => format!("{} ({})", info.name, info.file),
                }
            }
            None => "[python frame unreadable]".to_string(),
        };
        if self.frame_tokens.len() >= MAX_FRAME_TOKENS {
            self.frame_tokens.clear();
        }
        let token = frame_tokens::token(name, MODULE);
        self.frame_tokens.insert((code, instr), token);
        token
    }

    /// The code object at `addr`, read once.
    fn code(&mut self, addr: u64) -> Option<Rc<Code>> {
        if let Some(known) = self.codes.get(&addr) {
            return known.clone();
        }
        let code = self.read_code(addr).map(Rc::new);
        // A code object that could not be read is tried again next time: the process
        // may still have been writing it.
        if code.is_some() {
            self.codes.insert(addr, code.clone());
        }
        code
    }

    fn read_code(&self, addr: u64) -> Option<Code> {
        let layout = &self.layout;
        let name_at = layout.code_qualname.unwrap_or(layout.code_name);
        let name = self.read_unicode(self.read_u64(addr + name_at)?)?;
        let filename = self.read_unicode(self.read_u64(addr + layout.code_filename)?)?;
        let mut first_line = [0u8; 4];
        self.read(addr + layout.code_firstlineno, &mut first_line)?;
        let linetable = self.read_bytes(self.read_u64(addr + layout.code_linetable)?)?;
        Some(Code {
            name,
            file: short_file_name(&filename),
            first_line: u32::from_le_bytes(first_line),
            linetable,
        })
    }

    fn read_unicode(&self, addr: u64) -> Option<String> {
        let layout = &self.layout;
        let header_len = layout.compact_data as usize;
        let mut header = vec![0u8; header_len];
        self.read(addr, &mut header)?;
        let data_len = objects::unicode_data_len(layout, &header)?.min(MAX_OBJECT_BYTES);
        let data_at = objects::unicode_data_offset(layout, &header)?;
        let mut bytes = vec![0u8; data_at + data_len];
        self.read(addr, &mut bytes)?;
        objects::decode_unicode(layout, &bytes)
    }

    fn read_bytes(&self, addr: u64) -> Option<Vec<u8>> {
        let layout = &self.layout;
        let mut header = vec![0u8; layout.bytes_data as usize];
        self.read(addr, &mut header)?;
        let len = objects::bytes_len(layout, &header)?.min(MAX_OBJECT_BYTES);
        let mut data = vec![0u8; len];
        self.read(addr + layout.bytes_data, &mut data)?;
        Some(data)
    }
}

impl StackMerger for Interpreter {
    fn merge_python(&mut self, stack: UnwoundStack, python: &PythonStack) -> UnwoundStack {
        self.merge(stack, &PythonFrames::from_kernel(python))
    }
}

/// The symbols of an interpreter's file that the tracer needs.
const INTERPRETER_SYMBOLS: [&str; 4] = [
    "_PyRuntime",
    "Py_Version",
    "_PyEval_EvalFrameDefault",
    "_PyEval_EvalFrameDefault.cold",
];

/// `co_filename` as frames show it: the file's name, with its directory for a
/// package's `__init__.py`.
fn short_file_name(path: &str) -> String {
    let mut parts = path.rsplit('/');
    let name = parts.next().unwrap_or(path);
    match (name, parts.next()) {
        ("__init__.py", Some(dir)) if !dir.is_empty() => format!("{dir}/{name}"),
        _ => name.to_string(),
    }
}

/// `(3, 9)` from `libpython3.9.so.1.0`, `python3.10` or `libpython3.8d.so`.
fn version_from_file_name(name: &str) -> Option<(u8, u8)> {
    let rest = name
        .strip_prefix("libpython3.")
        .or_else(|| name.strip_prefix("python3."))?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((3, digits.parse().ok()?))
}

/// `stack` (innermost first) with each native frame that `is_eval` says is
/// `_PyEval_EvalFrameDefault` replaced by the next group of Python frames (innermost
/// first). Groups left over, for calls whose native frames were not found (unwinding
/// stopped early, or code without symbols), go outward of the last frame replaced, or
/// at the root when none was.
pub(crate) fn merge(
    stack: UnwoundStack,
    groups: &[Vec<u64>],
    is_eval: impl Fn(u64) -> bool,
) -> UnwoundStack {
    let mut merged = UnwoundStack::default();
    let mut groups = groups.iter();
    let mut last_replaced = None;
    for (i, (&addr, &by_fp)) in stack.addrs.iter().zip(&stack.by_frame_pointer).enumerate() {
        // Return addresses are looked up in the call instruction, one byte before.
        let lookup = if i == 0 { addr } else { addr.wrapping_sub(1) };
        if is_eval(lookup)
            && let Some(group) = groups.next()
        {
            merged.addrs.extend_from_slice(group);
            merged.by_frame_pointer.extend(group.iter().map(|_| false));
            last_replaced = Some(merged.addrs.len());
            continue;
        }
        merged.addrs.push(addr);
        merged.by_frame_pointer.push(by_fp);
    }
    let rest: Vec<u64> = groups.flatten().copied().collect();
    if !rest.is_empty() {
        let at = last_replaced.unwrap_or(merged.addrs.len());
        merged.addrs.splice(at..at, rest.iter().copied());
        merged
            .by_frame_pointer
            .splice(at..at, rest.iter().map(|_| false));
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(addrs: &[u64]) -> UnwoundStack {
        UnwoundStack {
            addrs: addrs.to_vec(),
            by_frame_pointer: addrs.iter().map(|_| false).collect(),
        }
    }

    const EVAL: Range<u64> = 0x1000..0x2000;

    #[test]
    fn each_eval_frame_becomes_its_group_and_c_frames_stay_between() {
        // sleep <- time_sleep <- eval#1 <- cfunction_call <- eval#2 <- main
        let native = stack(&[0x9000, 0x8001, 0x1801, 0x7001, 0x1401, 0x6001]);
        let groups = vec![vec![11, 12], vec![21]];
        let merged = merge(native, &groups, |a| EVAL.contains(&a));
        assert_eq!(merged.addrs, [0x9000, 0x8001, 11, 12, 0x7001, 21, 0x6001]);
        assert_eq!(merged.by_frame_pointer.len(), merged.addrs.len());
    }

    #[test]
    fn a_return_address_just_past_the_eval_function_is_its_call() {
        let native = stack(&[0x9000, 0x2000]);
        let merged = merge(native, &[vec![5]], |a| EVAL.contains(&a));
        assert_eq!(merged.addrs, [0x9000, 5]);
    }

    #[test]
    fn groups_without_their_native_frame_go_outward_of_the_last_one_placed() {
        let native = stack(&[0x9000, 0x1801, 0x6001]);
        let merged = merge(native, &[vec![1], vec![2], vec![3]], |a| EVAL.contains(&a));
        assert_eq!(merged.addrs, [0x9000, 1, 2, 3, 0x6001]);
        let native = stack(&[0x9000]);
        let merged = merge(native, &[vec![1], vec![2]], |a| EVAL.contains(&a));
        assert_eq!(merged.addrs, [0x9000, 1, 2]);
    }

    #[test]
    fn versions_and_file_names() {
        assert_eq!(version_from_file_name("libpython3.9.so.1.0"), Some((3, 9)));
        assert_eq!(version_from_file_name("python3.12"), Some((3, 12)));
        assert_eq!(version_from_file_name("python3"), None);
        assert_eq!(
            short_file_name("/usr/lib/python3.11/threading.py"),
            "threading.py"
        );
        assert_eq!(short_file_name("/a/pkg/__init__.py"), "pkg/__init__.py");
        assert_eq!(short_file_name("<string>"), "<string>");
    }

    #[test]
    fn kernel_frames_split_at_their_boundaries() {
        let mut kernel = PythonStack::EMPTY;
        kernel.count = 3;
        kernel.boundaries = 0b110;
        for (i, f) in kernel.frames.iter_mut().take(3).enumerate() {
            f.code = i as u64 + 1;
        }
        let frames = PythonFrames::from_kernel(&kernel);
        assert_eq!(frames.outermost, [false, true, true]);
        assert_eq!(frames.frames.len(), 3);
    }
}
