//! The link keeper: a small process of tracer's own that creates and holds the uprobe
//! links, so that they are registered and removed in a process no signal aimed at the
//! tracer reaches.
//!
//! Why: removing a uprobe restores the target's instruction through
//! `get_user_pages_remote`, which fails while the removing task has a fatal signal
//! pending; the kernel then logs "failed to unregister, leaking uprobe" and leaves the
//! breakpoint and the raised semaphore in the target for good. A tracer SIGKILLed while it
//! detaches (or while a link is being created, whose error path unregisters what it had
//! registered) would do exactly that. The keeper runs tracer's own binary (a fresh exec,
//! never a bare fork of a threaded process), in a session of its own so the terminal's
//! Ctrl-C and a kill of tracer's process group do not reach it, ignoring the catchable
//! stop signals. It creates each link when asked, holds the only reference to it, and
//! closes them all when asked, or when the tracer's end of the socket closes however the
//! tracer ended: with no fatal signal pending, every site gets its instruction back and
//! every semaphore drops.
//!
//! A SIGKILL can still reach the keeper (with the tracer: `pkill -9 -f tracer`, a cgroup
//! kill). One that finds it waiting is harmless: the signal is taken off the pending set
//! before the process exits and closes its links, so they are removed in full. One that
//! comes while the keeper closes a link is not, so the keeper never closes one itself: it
//! pins each (see [`super::pins`]), closes its descriptor and removes the pin, and the
//! kernel's workers remove the uprobes, all at once and out of any signal's reach. Killed
//! half-way, it leaves links pinned, attached and working, for the next tracer to
//! release.
//!
//! The keeper also continues the processes the kernel holds stopped at `dlopen` (the
//! `HELD` map, see `Loader::hold_at_dlopen`) once it has released the links, so a tracer
//! that dies while one is held (SIGKILL, a crash) leaves it running, not stopped; it
//! switches the programs off first (the `CONTROL` map), so no process is held meanwhile.
//!
//! The protocol is one `SOCK_SEQPACKET` message per request, each answered by an errno
//! (0 for success): an attach request carries the program's fd (`SCM_RIGHTS`), the
//! process filter and the uprobes; a held-map or control-map request carries the map's
//! fd; a release request has no body.

use std::{
    ffi::OsStr,
    io::{self, IoSlice, IoSliceMut},
    mem::MaybeUninit,
    os::{
        fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
        unix::{ffi::OsStrExt as _, process::CommandExt as _},
    },
    path::Path,
    process::{Child, Command, Stdio},
};

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType, recvmsg, sendmsg, socketpair,
};

use super::{
    pins::KeeperPins,
    sys::{self, MultiUprobe},
};

/// The first argument that makes `tracer` run as a link keeper (see [`serve`]).
pub(crate) const KEEPER_ARG: &str = "__link-keeper";

/// The most uprobes one link (one request) takes: keeps a request well inside the
/// socket's buffer (24 bytes each), and each link's removal short.
pub(crate) const MAX_UPROBES_PER_LINK: usize = 2048;

const REQUEST_ATTACH: u32 = 1;
const REQUEST_RELEASE: u32 = 2;
const REQUEST_HELD_MAP: u32 = 3;
/// Attaches a return probe link (the uprobes fire at the functions' returns).
const REQUEST_ATTACH_RETURN: u32 = 4;
const REQUEST_CONTROL_MAP: u32 = 5;
/// Takes a descriptor to close later (a uprobe perf event of the tracer's own).
const REQUEST_CLOSE_LATER: u32 = 6;
/// Closes what it took to close later, on threads of the keeper's own.
const REQUEST_CLOSE_NOW: u32 = 7;
/// kind, pid (0: every process), uprobe count, path length.
const HEADER_BYTES: usize = 16;
const UPROBE_BYTES: usize = 24;
const MAX_REQUEST_BYTES: usize =
    HEADER_BYTES + libc::PATH_MAX as usize + MAX_UPROBES_PER_LINK * UPROBE_BYTES;

/// tracer's end of the keeper: requests go through it, answers come back.
pub(crate) struct LinkKeeper {
    socket: OwnedFd,
    child: Child,
    links: usize,
}

impl LinkKeeper {
    /// Starts the keeper (tracer's own executable, [`KEEPER_ARG`]), its end of the socket
    /// as its standard input. Cheap to start early: it only waits for requests.
    pub(crate) fn spawn() -> io::Result<Self> {
        let (ours, theirs) = socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        // Answers are awaited in slices of this, to look at the keeper in between.
        rustix::net::sockopt::set_socket_timeout(
            &ours,
            rustix::net::sockopt::Timeout::Recv,
            Some(std::time::Duration::from_millis(50)),
        )?;
        let child = Command::new("/proc/self/exe")
            .arg0("tracer-link-keeper")
            .arg(KEEPER_ARG)
            .stdin(Stdio::from(theirs))
            // The keeper writes nothing: a stalled terminal or pipe must never hold it.
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        Ok(Self {
            socket: ours,
            child,
            links: 0,
        })
    }

    /// The keeper's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Has the keeper attach `prog` to `uprobes` (at most [`MAX_UPROBES_PER_LINK`]) of
    /// the file at `path`, in process `pid` only or in every process.
    pub(crate) fn link_uprobe_multi(
        &mut self,
        prog: BorrowedFd<'_>,
        path: &Path,
        uprobes: &[MultiUprobe],
        pid: Option<u32>,
        ret: bool,
    ) -> io::Result<()> {
        assert!(uprobes.len() <= MAX_UPROBES_PER_LINK);
        let path = path.as_os_str().as_bytes();
        if path.len() >= libc::PATH_MAX as usize || path.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "path too long or contains NUL",
            ));
        }
        let mut request = Vec::with_capacity(HEADER_BYTES + path.len() + uprobes.len() * 24);
        for word in [
            if ret {
                REQUEST_ATTACH_RETURN
            } else {
                REQUEST_ATTACH
            },
            pid.unwrap_or(0),
            uprobes.len() as u32,
            path.len() as u32,
        ] {
            request.extend_from_slice(&word.to_ne_bytes());
        }
        request.extend_from_slice(path);
        for uprobe in uprobes {
            for word in [uprobe.offset, uprobe.ref_ctr_offset, uprobe.cookie] {
                request.extend_from_slice(&word.to_ne_bytes());
            }
        }
        self.request(&request, Some(prog))?;
        self.links += 1;
        Ok(())
    }

    /// Gives the keeper the map of processes held at `dlopen`, to continue them whenever
    /// it closes the links.
    pub(crate) fn watch_held(&mut self, held: BorrowedFd<'_>) -> io::Result<()> {
        self.request(&REQUEST_HELD_MAP.to_ne_bytes(), Some(held))
    }

    /// Gives the keeper the map of the programs' switches, to switch them off before it
    /// releases the links however the tracer ended.
    pub(crate) fn watch_control(&mut self, control: BorrowedFd<'_>) -> io::Result<()> {
        self.request(&REQUEST_CONTROL_MAP.to_ne_bytes(), Some(control))
    }

    /// Has the keeper close `fds` (uprobe perf events of the tracer's own) on threads of
    /// its own: removing a uprobe waits for grace periods, and a SIGKILL reaching the
    /// tracer meanwhile would leave it registered for good. The keeper takes each, the
    /// tracer closes its own (the keeper's copy keeps the uprobe), and the keeper closes
    /// them; those it could not take are returned.
    pub(crate) fn close_for_us(&mut self, fds: Vec<OwnedFd>) -> Vec<OwnedFd> {
        let mut not_taken = Vec::new();
        for fd in fds {
            if self
                .request(&REQUEST_CLOSE_LATER.to_ne_bytes(), Some(fd.as_fd()))
                .is_err()
            {
                not_taken.push(fd);
            }
        }
        if self
            .request(&REQUEST_CLOSE_NOW.to_ne_bytes(), None)
            .is_err()
        {
            log::debug!("the keeper did not close the warm-up uprobes now");
        }
        not_taken
    }

    /// Has the keeper release every link it holds: the kernel's workers then give the
    /// sites their instructions back and drop the semaphores, within a grace period. A
    /// keeper that was killed leaves its links pinned: they are released from here.
    pub(crate) fn release_all(&mut self) -> io::Result<()> {
        if self.links == 0 {
            return Ok(());
        }
        self.links = 0;
        match self.request(&REQUEST_RELEASE.to_ne_bytes(), None) {
            Ok(()) => Ok(()),
            Err(e) if !self.is_alive() => {
                let released = super::pins::release_keeper(self.pid())?;
                log::warn!("the link keeper had died ({e}): released its {released}");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the keeper still runs (a zombie, not yet reaped, does not).
    pub(crate) fn is_alive(&self) -> bool {
        !matches!(
            crate::system::procfs::process_state(self.pid()),
            None | Some('Z' | 'X')
        )
    }

    /// Sends one request and waits for its errno. A keeper stopped by a signal is
    /// continued (it must never stop: the tracer would wait for it for good), and a keeper
    /// that died is an error.
    fn request(&self, body: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let fds = fd.map(|fd| [fd]);
        if let Some(fds) = &fds {
            control.push(SendAncillaryMessage::ScmRights(fds));
        }
        sendmsg(
            &self.socket,
            &[IoSlice::new(body)],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
        let mut answer = [0u8; 4];
        let got = loop {
            let mut no_control = RecvAncillaryBuffer::new(&mut []);
            match recvmsg(
                &self.socket,
                &mut [IoSliceMut::new(&mut answer)],
                &mut no_control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(got) => break got,
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {
                    if !self.is_alive() {
                        return Err(io::Error::other("the link keeper was killed"));
                    }
                    continue_if_stopped(self.pid());
                }
                Err(e) => return Err(e.into()),
            }
        };
        if got.bytes != answer.len() {
            return Err(io::Error::other("the link keeper exited"));
        }
        match i32::from_ne_bytes(answer) {
            0 => Ok(()),
            errno => Err(io::Error::from_raw_os_error(errno)),
        }
    }
}

impl Drop for LinkKeeper {
    /// Closing our end makes the keeper release every link and exit; it is reaped so no
    /// zombie is left while tracer still runs (it exits at once after the release).
    fn drop(&mut self) {
        if self.links > 0 {
            let _ = self.release_all();
        }
        continue_if_stopped(self.pid());
        // SAFETY: shutting down our own socket fd; it stays open until dropped.
        unsafe { libc::shutdown(self.socket.as_raw_fd(), libc::SHUT_RDWR) };
        let _ = self.child.wait();
    }
}

/// Continues the keeper if a signal stopped it, and says so once.
pub(crate) fn continue_if_stopped(pid: u32) {
    if matches!(crate::system::procfs::process_state(pid), Some('T' | 't')) {
        continue_keeper(pid);
    }
}

/// Continues the keeper `pid`, stopped by a signal, and says so once.
fn continue_keeper(pid: u32) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        log::warn!("the link keeper (process {pid}) was stopped by a signal: continued it");
    }
}

/// Watches the keeper `pid` while a trace runs: continues it whenever a signal stops it,
/// and ends with [`crate::system::stop::StopReason::KeeperKilled`] once it is gone (its links
/// stay pinned and working until the stop releases them). Pending forever without one.
/// The keeper is our child: the kernel's SIGCHLD tells of its stop or its death, and its
/// state is read then, and once a second in case a signal was merged with another.
pub(crate) async fn watch(pid: Option<u32>) -> io::Result<crate::system::stop::StopReason> {
    let Some(pid) = pid else {
        return std::future::pending().await;
    };
    let mut children = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
    let mut ticker = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = children.recv() => {}
            _ = ticker.tick() => {}
        }
        match crate::system::procfs::process_state(pid) {
            None | Some('Z' | 'X') => return Ok(crate::system::stop::StopReason::KeeperKilled),
            Some('T' | 't') => continue_keeper(pid),
            Some(_) => {}
        }
    }
}

/// Whether this process was started as the link keeper.
pub(crate) fn is_keeper(first_arg: Option<&OsStr>) -> bool {
    first_arg.is_some_and(|arg| arg == KEEPER_ARG)
}

/// The keeper's life: serve requests on standard input until tracer's end closes, then
/// release every link. Returns the exit code.
pub(crate) fn serve() -> i32 {
    // Out of tracer's session and process group: neither the terminal's signals nor a
    // kill of the group reach the keeper. Every catchable signal but those of a fault in
    // the keeper itself is ignored, so only SIGKILL and SIGSTOP act on it.
    // SAFETY: setsid, signal, prctl (with a NUL-terminated name) and close_range (of
    // descriptors this process does not use) have no memory preconditions.
    unsafe {
        libc::setsid();
        for signal in 1..=libc::SIGRTMAX() {
            if ![
                libc::SIGKILL,
                libc::SIGSTOP,
                libc::SIGCHLD,
                libc::SIGSEGV,
                libc::SIGBUS,
                libc::SIGILL,
                libc::SIGFPE,
                libc::SIGTRAP,
                libc::SIGSYS,
                libc::SIGABRT,
            ]
            .contains(&signal)
            {
                libc::signal(signal, libc::SIG_IGN);
            }
        }
        // Named as `ps` shows it (an exec of /proc/self/exe is named `exe`).
        libc::prctl(libc::PR_SET_NAME, c"tracer-keeper".as_ptr(), 0, 0, 0);
        // Whatever the tracer's caller left open and inheritable (a pipe's write end, say)
        // is not the keeper's to hold: its reader would wait for the keeper too.
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
    }
    let mut kept = Kept::default();
    // SAFETY: fd 0 is the socket the tracer passed, owned by this process alone.
    let socket = unsafe { BorrowedFd::borrow_raw(0) };
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
    loop {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = recvmsg(
            socket,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        );
        let bytes = match received {
            Ok(msg) if msg.bytes > 0 => msg.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            // The tracer's end closed (0 bytes) or broke: it has exited or given up.
            _ => break,
        };
        let mut fd = None;
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = message {
                fd = fds.into_iter().next();
            }
        }
        let errno = match handle(&buf[..bytes], fd, &mut kept) {
            Ok(()) => 0,
            Err(e) => e.raw_os_error().unwrap_or(libc::EINVAL),
        };
        let answer = errno.to_ne_bytes();
        let mut no_control = SendAncillaryBuffer::new(&mut []);
        if sendmsg(
            socket,
            &[IoSlice::new(&answer)],
            &mut no_control,
            SendFlags::NOSIGNAL,
        )
        .is_err()
        {
            break;
        }
    }
    kept.release();
    for closing in kept.closing.drain(..) {
        let _ = closing.join();
    }
    0
}

/// What the keeper holds.
#[derive(Default)]
struct Kept {
    links: Vec<OwnedFd>,
    /// The map of processes held at `dlopen`.
    held: Option<OwnedFd>,
    /// The map of the programs' switches.
    control: Option<OwnedFd>,
    /// What the tracer handed over to close at the release.
    to_close: Vec<OwnedFd>,
    /// The threads closing it: joined before the keeper exits, whose exit would kill
    /// them mid-close.
    closing: Vec<std::thread::JoinHandle<()>>,
}

impl Kept {
    /// Closes what the tracer handed over, side by side on a thread of its own.
    fn close_handed_over(&mut self) {
        let to_close = std::mem::take(&mut self.to_close);
        if to_close.is_empty() {
            return;
        }
        // Without a thread the descriptors are closed here, as the closure is dropped.
        if let Ok(closing) = std::thread::Builder::new().spawn(move || close_side_by_side(to_close))
        {
            self.closing.push(closing);
        }
    }

    /// Switches the programs off, releases every link and continues the processes held at
    /// `dlopen`. Each link is pinned, its descriptor closed and its pin removed: the pin
    /// is then its last reference, whose removal has a kernel worker remove the uprobes,
    /// however the keeper ends meanwhile. Without a BPF filesystem the keeper closes them
    /// itself.
    fn release(&mut self) {
        self.close_handed_over();
        if let Some(control) = &self.control {
            let _ = sys::array_set_u32(control.as_fd(), tracer_common::control::STOPPED, 1);
        }
        if self.links.is_empty() {
            continue_held(self.held.as_ref());
            return;
        }
        let Ok(mut pins) = KeeperPins::create() else {
            close_side_by_side(std::mem::take(&mut self.links));
            continue_held(self.held.as_ref());
            return;
        };
        // Killed from here on, the keeper leaves what the next tracer needs to finish.
        if let Some(control) = &self.control {
            let _ = pins.pin_control(control.as_fd());
        }
        if let Some(held) = &self.held {
            let _ = pins.pin_held(held.as_fd());
        }
        let mut unpinned = Vec::new();
        let mut pinned = Vec::new();
        for link in self.links.drain(..) {
            match pins.pin_link(link.as_fd()) {
                Ok(pin) => pinned.push(pin),
                Err(_) => unpinned.push(link),
            }
        }
        for pin in pinned {
            let _ = std::fs::remove_file(pin);
        }
        close_side_by_side(unpinned);
        continue_held(self.held.as_ref());
        pins.remove();
    }
}

/// Closes `links` (or uprobe perf events) on threads of their own, and waits for them:
/// each close waits for a grace period, and those of links closed at once pass together.
pub(super) fn close_side_by_side(links: Vec<OwnedFd>) {
    const THREADS: usize = 32;
    let per_thread = links.len().div_ceil(THREADS).max(1);
    let mut links = links;
    std::thread::scope(|scope| {
        while !links.is_empty() {
            let batch: Vec<OwnedFd> = links.drain(..per_thread.min(links.len())).collect();
            // Without a thread the batch is closed here, as the closure is dropped.
            let _ = std::thread::Builder::new().spawn_scoped(scope, move || drop(batch));
        }
    });
}

/// Continues every process the kernel held stopped at `dlopen`.
fn continue_held(held: Option<&OwnedFd>) {
    if let Some(held) = held {
        super::pins::continue_held(held.as_fd());
    }
}

/// One request: attach (a new link kept), a map to watch, or release (every link).
fn handle(request: &[u8], fd: Option<OwnedFd>, kept: &mut Kept) -> io::Result<()> {
    let invalid = || io::Error::from_raw_os_error(libc::EINVAL);
    let word = |i: usize| -> io::Result<u32> {
        let bytes = request.get(i * 4..i * 4 + 4).ok_or_else(invalid)?;
        Ok(u32::from_ne_bytes(bytes.try_into().unwrap()))
    };
    match word(0)? {
        REQUEST_RELEASE => {
            kept.release();
            Ok(())
        }
        REQUEST_HELD_MAP => {
            kept.held = Some(fd.ok_or_else(invalid)?);
            Ok(())
        }
        REQUEST_CONTROL_MAP => {
            kept.control = Some(fd.ok_or_else(invalid)?);
            Ok(())
        }
        REQUEST_CLOSE_LATER => {
            kept.to_close.push(fd.ok_or_else(invalid)?);
            Ok(())
        }
        REQUEST_CLOSE_NOW => {
            kept.close_handed_over();
            Ok(())
        }
        kind @ (REQUEST_ATTACH | REQUEST_ATTACH_RETURN) => {
            let prog = fd.ok_or_else(invalid)?;
            let (pid, count, path_len) = (word(1)?, word(2)? as usize, word(3)? as usize);
            let path = request
                .get(HEADER_BYTES..HEADER_BYTES + path_len)
                .ok_or_else(invalid)?;
            let table = &request[HEADER_BYTES + path_len..];
            if table.len() != count * UPROBE_BYTES {
                return Err(invalid());
            }
            let u64_at = |i: usize| u64::from_ne_bytes(table[i * 8..i * 8 + 8].try_into().unwrap());
            let uprobes: Vec<MultiUprobe> = (0..count)
                .map(|i| MultiUprobe {
                    offset: u64_at(3 * i),
                    ref_ctr_offset: u64_at(3 * i + 1),
                    cookie: u64_at(3 * i + 2),
                })
                .collect();
            let path = Path::new(OsStr::from_bytes(path));
            let link = sys::link_uprobe_multi(
                prog.as_fd(),
                path,
                &uprobes,
                (pid != 0).then_some(pid),
                kind == REQUEST_ATTACH_RETURN,
            )?;
            kept.links.push(link);
            Ok(())
        }
        _ => Err(invalid()),
    }
}
