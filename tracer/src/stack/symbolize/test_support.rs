//! What the unit tests of the symbolizer share: a maps file, and functions of this test
//! binary to name.

pub(super) const MAPS: &str = "\
55d0c8a00000-55d0c8a02000 r--p 00000000 fd:01 1234                       /usr/bin/app
55d0c8a02000-55d0c8a05000 r-xp 00002000 fd:01 1234                       /usr/bin/app
7f0000000000-7f0000010000 rwxp 00000000 00:00 0 
7f1000000000-7f1000020000 r-xp 00028000 fd:01 5678                       /opt/lib with space/libfoo.so.1 (deleted)
7fff00000000-7fff00002000 r-xp 00000000 00:00 0                          [vdso]
";

#[inline(never)]
pub(super) fn symbolization_target(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(31).rotate_left(7)
}

unsafe extern "C" {
    /// glibc's backtrace(3): the simplest way to get return addresses in a test.
    fn backtrace(buffer: *mut *mut libc::c_void, size: libc::c_int) -> libc::c_int;
}

#[inline(never)]
fn return_addresses() -> Vec<u64> {
    let mut buffer = [std::ptr::null_mut(); 8];
    // SAFETY: the buffer holds as many entries as we pass as its size.
    let depth = unsafe { backtrace(buffer.as_mut_ptr(), buffer.len() as libc::c_int) };
    buffer[..depth.max(0) as usize]
        .iter()
        .map(|&p| p as u64)
        .collect()
}

#[inline(always)]
fn inlined_helper() -> Vec<u64> {
    std::hint::black_box(return_addresses())
}

#[inline(never)]
pub(super) fn calls_inlined_helper() -> Vec<u64> {
    std::hint::black_box(inlined_helper())
}
