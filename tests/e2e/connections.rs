//! One user holding thousands of idle connections to the socket does not starve the others:
//! the controller caps connections per user and in all (below its descriptor limit) and closes
//! connections that send no request.

use std::os::unix::ffi::OsStrExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::resource::{getrlimit, setrlimit, Resource};

use crate::harness::*;

/// Connections the flooding user tries to open.
const FLOOD: u32 = 5000;

/// The `wharf dev` process serving `c`.
fn dev_pid(c: &Cluster) -> i32 {
    let dir = c.dir.as_os_str().as_bytes().to_vec();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            (args.get(1) == Some(&&b"dev"[..]) && args.contains(&dir.as_slice())).then_some(pid)
        })
        .expect("the dev process")
}

fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Forks a process that becomes `user` and opens up to `FLOOD` connections to `socket`, sends
/// no byte on them and holds them until killed. Returns its pid and how many connected.
fn flood(user: &User, socket: &std::path::Path) -> (nix::unistd::Pid, u32) {
    // Everything the child needs is made before the fork: after it, only system calls.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let path = socket.as_os_str().as_bytes();
    assert!(path.len() < addr.sun_path.len());
    for (d, s) in addr.sun_path.iter_mut().zip(path) {
        *d = *s as libc::c_char;
    }
    let (uid, gid) = (user.uid, user.gid);
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let (r, w) = nix::unistd::pipe().unwrap();
    use std::os::fd::AsRawFd;
    let (rfd, wfd) = (r.as_raw_fd(), w.as_raw_fd());
    // SAFETY: the child calls only async-signal-safe functions and never returns.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => unsafe {
            let lim = libc::rlimit {
                rlim_cur: 2 * FLOOD as libc::rlim_t,
                rlim_max: 2 * FLOOD as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                // Without CAP_SYS_RESOURCE: as many as the hard limit allows.
                let lim = libc::rlimit {
                    rlim_cur: hard as libc::rlim_t,
                    rlim_max: hard as libc::rlim_t,
                };
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                libc::_exit(2);
            }
            let mut connected: u32 = 0;
            for _ in 0..FLOOD {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
                if fd < 0 {
                    break;
                }
                let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                if libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) == 0 {
                    connected += 1;
                } else {
                    libc::close(fd);
                }
            }
            libc::write(wfd, &connected as *const u32 as *const libc::c_void, 4);
            loop {
                libc::pause();
            }
        },
        nix::unistd::ForkResult::Parent { child } => {
            drop(w);
            let mut buf = [0u8; 4];
            let n = nix::unistd::read(rfd, &mut buf).unwrap();
            assert_eq!(n, 4, "the flooding process died");
            drop(r);
            (child, u32::from_ne_bytes(buf))
        }
    }
}

/// `wharf submit --wrap true` as `user`; its duration, or a failure after 20 s.
fn timed_submit(c: &Cluster, user: &User) -> Result<Duration, String> {
    let home = c.home(user);
    let started = Instant::now();
    let mut child = setpriv(user)
        .arg(wharf_bin())
        .args(["submit", "--wrap", "true"])
        .env("WHARF_SOCKET", &c.socket)
        .current_dir(&home)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let took = started.elapsed();
            let out = child.wait_with_output().unwrap();
            return if status.success() {
                Ok(took)
            } else {
                Err(format!("failed after {took:?}: {}", stderr(&out)))
            };
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            return Err("no answer in 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn thousands_of_idle_connections_from_one_user_do_not_starve_another() {
    if !can_run("thousands_of_idle_connections_from_one_user_do_not_starve_another") {
        return;
    }
    let (flooder, victim) = (user("whctl-flood"), user("whctl-victim"));
    // The daemon inherits a small soft descriptor limit (as under many init systems) with
    // room above it, up to the hard limit: the controller raises it at start.
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, 1024.min(hard), hard).unwrap();
    let c = Cluster::start_with("[limits]\nheader_timeout = \"3s\"\n");
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
    let pid = dev_pid(&c);
    let baseline = open_fds(pid);

    let (attacker, connected) = flood(&flooder, &c.socket);
    let result = std::panic::catch_unwind(|| {
        assert!(
            connected >= 1000,
            "only {connected} of {FLOOD} connections made: the test did not flood"
        );
        for i in 0..3 {
            match timed_submit(&c, &victim) {
                Ok(took) => assert!(
                    took < Duration::from_secs(1),
                    "submit {i} of another user took {took:?} during the flood"
                ),
                Err(e) => panic!("submit {i} of another user during the flood: {e}"),
            }
        }
        let held = open_fds(pid);
        assert!(
            held < baseline + 200,
            "the controller holds {held} descriptors (from {baseline}) for one user's idle connections"
        );
        // Connections that never send a request are closed after the header timeout (3 s).
        let deadline = Instant::now() + Duration::from_secs(15);
        while open_fds(pid) > baseline + 8 {
            assert!(
                Instant::now() < deadline,
                "idle connections still open: {} descriptors (from {baseline})",
                open_fds(pid)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let _ = nix::sys::signal::kill(attacker, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(attacker, None);
    if let Err(e) = result {
        eprintln!("log:\n{}", c.log());
        std::panic::resume_unwind(e);
    }
}

#[test]
fn a_stalled_request_is_closed_after_the_idle_timeout() {
    if !can_run("a_stalled_request_is_closed_after_the_idle_timeout") {
        return;
    }
    use std::io::{Read, Write};
    // The harness's agents poll with a 5 s wait: 11 s is the shortest idle timeout allowed.
    let c = Cluster::start_with("[limits]\nheader_timeout = \"3s\"\nidle_timeout = \"11s\"\n");
    let mut s = std::os::unix::net::UnixStream::connect(&c.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(40))).unwrap();
    // A complete head, then one byte of a 1000-byte body, then nothing.
    s.write_all(b"POST /v1/jobs HTTP/1.1\r\nHost: wharf\r\nContent-Length: 1000\r\n\r\n{")
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(8) && took < Duration::from_secs(30),
        "the stalled request ended after {took:?}: {}",
        String::from_utf8_lossy(&answer)
    );
    // Meanwhile, and after, the controller serves others.
    let out = c.wharf(&["queue"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Holds `per_source` idle TCP connections to `port` from each source address, reopening
/// those the controller closes, until dropped.
struct TcpFlood {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TcpFlood {
    fn start(sources: Vec<std::net::Ipv4Addr>, per_source: usize, port: u16) -> TcpFlood {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let open = |src: std::net::Ipv4Addr| -> Option<OwnedFd> {
                // SAFETY: plain socket calls on a descriptor this function owns.
                unsafe {
                    let fd =
                        libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
                    if fd < 0 {
                        return None;
                    }
                    let fd = OwnedFd::from_raw_fd(fd);
                    let mut a: libc::sockaddr_in = std::mem::zeroed();
                    a.sin_family = libc::AF_INET as libc::sa_family_t;
                    a.sin_addr.s_addr = u32::from(src).to_be();
                    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                    if libc::bind(fd.as_raw_fd(), &a as *const _ as *const libc::sockaddr, len) != 0
                    {
                        return None;
                    }
                    a.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
                    a.sin_port = port.to_be();
                    let r =
                        libc::connect(fd.as_raw_fd(), &a as *const _ as *const libc::sockaddr, len);
                    (r == 0 || *libc::__errno_location() == libc::EINPROGRESS).then_some(fd)
                }
            };
            let alive = |fd: &OwnedFd| {
                let mut b = [0u8; 1];
                // SAFETY: reads into a local buffer.
                let n = unsafe {
                    libc::recv(fd.as_raw_fd(), b.as_mut_ptr().cast(), 1, libc::MSG_DONTWAIT)
                };
                n > 0
                    || (n < 0
                        && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock)
            };
            let mut held: Vec<Vec<OwnedFd>> = sources.iter().map(|_| Vec::new()).collect();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                for (src, fds) in sources.iter().zip(&mut held) {
                    fds.retain(alive);
                    while fds.len() < per_source {
                        match open(*src) {
                            Some(fd) => fds.push(fd),
                            None => break,
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        TcpFlood {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for TcpFlood {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Jobs share their node's network, so any job can connect to the controller from its agent's
/// address. On the old code 64 idle connections from that address (the cap per TCP peer)
/// locked the agent out: its polls failed and the node went DOWN within the 10 s node timeout,
/// failing its jobs. Now a connection counts as unauthenticated until it shows the join token,
/// the oldest unauthenticated one is closed for a newcomer, and an agent's connection moves to
/// a pool of its own.
#[test]
fn idle_tcp_connections_from_the_agents_address_do_not_lock_it_out() {
    if !can_run("idle_tcp_connections_from_the_agents_address_do_not_lock_it_out") {
        return;
    }
    let c = TcpCluster::start("");
    let flood = TcpFlood::start(vec![std::net::Ipv4Addr::LOCALHOST], 100, c.port);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(25) {
        let nodes = c.nodes();
        assert!(
            nodes.contains("UP"),
            "the node went down {:?} into the flood: {nodes}\n{}",
            t.elapsed(),
            c.logs()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let id = submitted_id(&c.wharf(&["submit", "--wrap", "true"]));
    let t = Instant::now();
    loop {
        let job: serde_json::Value =
            serde_json::from_slice(&c.wharf(&["show", &id.to_string(), "--json"]).stdout).unwrap();
        if job["state"] == "COMPLETED" {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "a job did not run during the flood: {job}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(flood);
}

/// The socket and TCP have caps and counts of their own. On the old code they shared one
/// global cap: idle TCP connections from ten addresses (each under the per-address cap) filled
/// it, and a user's submit on the socket was closed unanswered.
#[test]
fn a_tcp_flood_does_not_starve_socket_users() {
    if !can_run("a_tcp_flood_does_not_starve_socket_users") {
        return;
    }
    let c = TcpCluster::start("max_connections = 300\n");
    let victim = user("whfc-sockuser");
    let home = c.dir.path().join("home-victim");
    std::fs::create_dir_all(&home).unwrap();
    nix::unistd::chown(&home, Some(victim.uid.into()), Some(victim.gid.into())).unwrap();
    let sources = (2..12)
        .map(|i| std::net::Ipv4Addr::new(127, 0, 0, i))
        .collect();
    let _flood = TcpFlood::start(sources, 60, c.port);
    std::thread::sleep(Duration::from_secs(3));
    for i in 0..3 {
        let t = Instant::now();
        let out = as_user(
            &victim,
            &home,
            wharf_bin(),
            &["submit", "--wrap", "true"],
            &c.socket,
        );
        let took = t.elapsed();
        assert!(
            out.status.success() && took < Duration::from_secs(1),
            "submit {i} on the socket during a TCP flood: {took:?}: {}\n{}",
            stderr(&out),
            c.logs()
        );
    }
}
