//! Integer socket options that socket2 does not wrap (`SO_SNDBUFFORCE`, `SO_RCVBUFFORCE`,
//! `TCP_NOTSENT_LOWAT`), set and read with `setsockopt`/`getsockopt` on any socket.

use std::io;
use std::os::fd::AsRawFd;

/// Set option `name` at `level` to `value` (clamped to a C int).
pub fn set_int(
    sock: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: usize,
) -> io::Result<()> {
    let v = libc::c_int::try_from(value).unwrap_or(libc::c_int::MAX);
    // SAFETY: a valid descriptor and a c_int option value that outlives the call.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Read option `name` at `level` as a non-negative integer.
pub fn get_int(sock: &impl AsRawFd, level: libc::c_int, name: libc::c_int) -> io::Result<usize> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the c_int.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    usize::try_from(v).map_err(|_| io::Error::other(format!("option {name} is negative: {v}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn an_option_set_reads_back() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        set_int(&l, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, 123_456).unwrap();
        assert_eq!(get_int(&l, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT).unwrap(), 123_456);
        let e = set_int(&l, libc::SOL_SOCKET, -1, 1).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOPROTOOPT));
    }
}
