//! A real partition for tests (issue 52): a Redis server in a network
//! namespace of its own, reached from the test's namespace over two veth
//! pairs (one per gateway), each of which can be taken down and brought
//! up again with `ip link`. The kernel then does what it does on a real
//! network: a link without carrier drops what is sent on it, an
//! established connection retransmits into the void, and a new one's SYN
//! goes unanswered until its connect times out. Needs root (or
//! CAP_NET_ADMIN), `ip` (iproute2) and `redis-server`.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A namespace holding one Redis server, with a link per side.
pub struct Partitioned {
    ns: String,
    /// Each link's name in the server's namespace, and the server's address
    /// on it.
    links: Vec<(String, String)>,
    redis: Option<Child>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        format!("`ip` (iproute2) must be installed (apt-get install iproute2): {e}")
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Partitioned {
    /// A namespace with a Redis server on port 6379 (its own namespace:
    /// no other test's port) and `sides` links to it.
    pub fn start(sides: usize) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("{:x}{n}", pid % 0xfffff);
        let ns = format!("rwt{tag}");
        ip(&["netns", "add", &ns]).unwrap_or_else(|e| {
            panic!("a network namespace is needed (run as root, or with CAP_NET_ADMIN): {e}")
        });
        let mut me = Self {
            ns,
            links: vec![],
            redis: None,
        };
        me.in_ns(&["ip", "link", "set", "lo", "up"]);
        // 10.(200 + n % 50).(pid % 64 * 4 + side).0/30: distinct across
        // the tests of one binary (n) and, mostly, across binaries (pid).
        for side in 0..sides {
            let (ours, theirs) = (format!("rw{tag}{side}"), format!("rw{tag}{side}p"));
            let net = format!("10.{}.{}", 200 + n % 50, (pid % 64) * 4 + side as u32);
            ip(&[
                "link", "add", &ours, "type", "veth", "peer", "name", &theirs, "netns", &me.ns,
            ])
            .unwrap();
            ip(&["addr", "add", &format!("{net}.1/30"), "dev", &ours]).unwrap();
            ip(&["link", "set", &ours, "up"]).unwrap();
            me.in_ns(&["ip", "addr", "add", &format!("{net}.2/30"), "dev", &theirs]);
            me.in_ns(&["ip", "link", "set", &theirs, "up"]);
            me.links.push((theirs, format!("{net}.2")));
        }
        let addrs: Vec<&str> = me.links.iter().map(|(_, a)| a.as_str()).collect();
        let child = Command::new("ip")
            .args(["netns", "exec", &me.ns, "redis-server", "--port", "6379"])
            .arg("--bind")
            .args(&addrs)
            // Reached over the veth links only, never loopback.
            .args(["--protected-mode", "no", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        me.redis = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect((addrs[0], 6379)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server in {} did not answer",
                me.ns
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        me
    }

    fn in_ns(&self, args: &[&str]) {
        let mut all = vec!["netns", "exec", &self.ns];
        all.extend_from_slice(args);
        ip(&all).unwrap();
    }

    /// The Redis URL over side `side`'s link.
    pub fn url(&self, side: usize) -> String {
        format!("redis://{}:6379/0", self.links[side].1)
    }

    /// Takes side `side`'s link down at the server's end: the test's end
    /// loses its carrier, and what is sent on it is dropped.
    pub fn cut(&self, side: usize) {
        self.in_ns(&["ip", "link", "set", &self.links[side].0, "down"]);
    }

    pub fn heal(&self, side: usize) {
        self.in_ns(&["ip", "link", "set", &self.links[side].0, "up"]);
    }

    /// `redis-cli` against the server, from inside its namespace.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns,
                "redis-cli",
                "-h",
                &self.links[0].1,
            ])
            .args(args)
            .output()
            .expect("redis-cli must be installed (apt-get install redis-tools)");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Partitioned {
    fn drop(&mut self) {
        if let Some(mut c) = self.redis.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Deleting the namespace deletes its ends of the veth pairs, and so
        // ours.
        let _ = ip(&["netns", "del", &self.ns]);
    }
}
