//! Redis servers for tests: each test starts its own `redis-server` on a free
//! loopback port (never the machine's 6379) and kills it when dropped.

#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    cluster: bool,
    /// With TLS: the TLS port (the plain `port` stays open for the test's
    /// own checks) and the server's arguments.
    pub tls: Option<(u16, Vec<String>)>,
    /// More arguments (`--replicaof`, say).
    pub extra: Vec<String>,
}

/// A `redis-sentinel` on a free loopback port, monitoring `mymaster`
/// (down after 1 s, quorum 2); killed when dropped.
pub struct Sentinel {
    child: Child,
    pub port: u16,
}

impl Sentinel {
    pub fn start(master_port: u16) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("ratewarden-sentinel-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor mymaster 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds mymaster 1000\n\
                 sentinel failover-timeout mymaster 10000\n\
                 sentinel parallel-syncs mymaster 1\n",
                dir.display()
            ),
        )
        .unwrap();
        let child = Command::new("redis-sentinel")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-sentinel must be installed (apt-get install redis-sentinel)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while server_pid(port) != Some(child.id()) {
            assert!(
                Instant::now() < deadline,
                "redis-sentinel did not answer on {port}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Self { child, port }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The master's port as this sentinel names it now.
    pub fn master_port(&self) -> Option<u16> {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(["sentinel", "get-master-addr-by-name", "mymaster"])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The files of a TLS redis-server: its certificate and key, and the CA
/// that signs clients' certificates (`require_clients`: they must send one).
pub struct RedisTlsFiles<'a> {
    pub cert: &'a std::path::Path,
    pub key: &'a std::path::Path,
    pub ca: &'a std::path::Path,
    pub require_clients: bool,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_any(false)
    }

    /// Starts on a free port. A port is free when chosen, not when
    /// redis-server binds it: another test may take it in between (or, in
    /// cluster mode, the bus port 10000 above it). Then redis-server exits,
    /// and another port is tried.
    pub fn start_any(cluster: bool) -> Self {
        (0..20)
            .find_map(|_| Self::start_on(free_port(), cluster))
            .expect("redis-server did not start on any of 20 free ports")
    }

    /// Starts with a TLS port beside the plain one (`--tls-port`; with
    /// `cluster`, the cluster bus speaks TLS too).
    pub fn start_tls(cluster: bool, files: &RedisTlsFiles<'_>) -> Self {
        (0..20)
            .find_map(|_| {
                let port = free_port();
                let dir = std::env::temp_dir()
                    .join(format!("ratewarden-redis-{}-{port}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                let tls_port = free_port();
                let mut args: Vec<String> = vec![
                    "--tls-port".into(),
                    tls_port.to_string(),
                    "--tls-cert-file".into(),
                    files.cert.display().to_string(),
                    "--tls-key-file".into(),
                    files.key.display().to_string(),
                    "--tls-ca-cert-file".into(),
                    files.ca.display().to_string(),
                    "--tls-auth-clients".into(),
                    if files.require_clients { "yes" } else { "no" }.into(),
                ];
                if cluster {
                    args.extend(["--tls-cluster".into(), "yes".into()]);
                    // The bus's TLS client certificate: the server's own.
                    args.extend([
                        "--tls-client-cert-file".into(),
                        files.cert.display().to_string(),
                        "--tls-client-key-file".into(),
                        files.key.display().to_string(),
                    ]);
                }
                let mut s = Self {
                    child: None,
                    port,
                    dir,
                    cluster,
                    tls: Some((tls_port, args)),
                    extra: vec![],
                };
                s.launch().then_some(s)
            })
            .expect("redis-server did not start with TLS on any of 20 free ports")
    }

    /// The `rediss://` URL of the TLS port.
    pub fn tls_url(&self) -> String {
        let (port, _) = self.tls.as_ref().expect("started with TLS");
        format!("rediss://127.0.0.1:{port}/0")
    }

    /// Starts on `port`; `None` when redis-server could not take it.
    pub fn start_on(port: u16, cluster: bool) -> Option<Self> {
        Self::start_with(port, cluster, vec![])
    }

    /// A replica of `master` on a free port.
    pub fn start_replica(master: &RedisServer) -> Self {
        (0..20)
            .find_map(|_| {
                Self::start_with(
                    free_port(),
                    false,
                    vec![
                        "--replicaof".into(),
                        "127.0.0.1".into(),
                        master.port.to_string(),
                    ],
                )
            })
            .expect("a replica did not start on any of 20 free ports")
    }

    fn start_with(port: u16, cluster: bool, extra: Vec<String>) -> Option<Self> {
        let dir =
            std::env::temp_dir().join(format!("ratewarden-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = Self {
            child: None,
            port,
            dir,
            cluster,
            tls: None,
            extra,
        };
        s.launch().then_some(s)
    }

    /// Starts again on the same port.
    pub fn restart(&mut self) {
        assert!(
            self.launch(),
            "redis-server did not start again on {}",
            self.port
        );
    }

    /// Spawns redis-server on `self.port` and waits until it answers; false
    /// when it exits instead (the port was taken).
    fn launch(&mut self) -> bool {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some((_, args)) = &self.tls {
            cmd.args(args);
        }
        cmd.args(&self.extra);
        if self.cluster {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ]);
        }
        let mut child = cmd
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if child.try_wait().unwrap().is_some() {
                return false;
            }
            // Whoever answers on the port must be this child, not a server
            // another test started there.
            if server_pid(self.port) == Some(child.id()) {
                self.child = Some(child);
                return true;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("redis-server did not answer on {}", self.port);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the server (SIGSTOP) or lets it go on (SIGCONT): its
    /// connections stay open and nothing answers, a blackhole at the server.
    pub fn pause(&self, paused: bool) {
        let pid = self.child.as_ref().expect("a running server").id();
        let signal = if paused { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill(1)");
        assert!(status.success(), "kill {signal} {pid}");
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli must be installed (apt-get install redis-tools)");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Names of key states in the server (every key but the gateways'
    /// announcements, `{ratewarden}:gateways`).
    pub fn state_keys(&self) -> Vec<String> {
        self.cli(&["--scan"])
            .lines()
            .filter(|k| !k.is_empty() && !k.ends_with("{ratewarden}:gateways"))
            .map(str::to_owned)
            .collect()
    }

    /// The fields of the state kept under `key` (packed little-endian
    /// doubles, `lua/rule.lua`), trailing zeros as stored; none if absent.
    pub fn state(&self, key: &str) -> Vec<u64> {
        state_fields(&self.cli(&["eval", STATE_FIELDS, "1", key]))
    }

    /// [`RedisServer::state`] read on a cluster replica (`READONLY`, then
    /// the same script as `EVAL_RO`, on one connection).
    pub fn state_on_replica(&self, key: &str) -> Vec<u64> {
        let mut child = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("redis-cli must be installed (apt-get install redis-tools)");
        let commands = format!("READONLY\nEVAL_RO \"{STATE_FIELDS}\" 1 {key}\n");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(commands.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&out.stdout);
        // READONLY's `OK` first.
        state_fields(out.split_once("OK\n").map_or("", |(_, fields)| fields))
    }

    /// Waits (polling, 5 s at most) until this replica's link to its master
    /// is down: after a master is killed, nothing more reaches it.
    pub fn wait_link_down(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !self
            .cli(&["info", "replication"])
            .contains("master_link_status:down")
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the replica on {} still links to its dead master after 5 s",
                self.port
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Whether this server replicates the one on `port`.
    pub fn replicates(&self, port: u16) -> bool {
        let info = self.cli(&["info", "replication"]);
        info.contains("role:slave") && info.contains(&format!("master_port:{port}"))
    }
}

/// A script that returns the fields of the state under `KEYS[1]`
/// (packed little-endian doubles, `lua/rule.lua`), unpacked by the server
/// (redis-cli prints a bulk string's bytes as they are; not every crate
/// that shares this file has `redis`).
const STATE_FIELDS: &str = "local v = redis.call('GET', KEYS[1]) or '' local out = {} \
    for i = 1, #v, 8 do out[#out + 1] = string.format('%d', (struct.unpack('<d', v, i))) end \
    return out";

/// [`STATE_FIELDS`]'s answer as redis-cli prints it: a number a line.
fn state_fields(text: &str) -> Vec<u64> {
    text.lines()
        .map(|l| l.trim().parse().expect("a state field"))
        .collect()
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `process_id` of the Redis server answering on `port`, if one does.
fn server_pid(port: u16) -> Option<u32> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(b"INFO server\r\n").ok()?;
    let mut got = Vec::new();
    let mut buf = [0; 4096];
    loop {
        let text = String::from_utf8_lossy(&got);
        if let Some(rest) = text.split("process_id:").nth(1)
            && let Some((pid, _)) = rest.split_once("\r\n")
        {
            return pid.parse().ok();
        }
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
    }
}

/// A 3-master Redis Cluster on loopback.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        Self::of((0..3).map(|_| RedisServer::start_any(true)).collect())
    }

    /// A cluster whose nodes speak TLS (client port and bus).
    pub fn start_tls(files: &RedisTlsFiles<'_>) -> Self {
        Self::of(
            (0..3)
                .map(|_| RedisServer::start_tls(true, files))
                .collect(),
        )
    }

    pub fn tls_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::tls_url).collect()
    }

    /// 3 masters and 3 replicas, failing over 1 s after a master stops
    /// answering (`cluster-node-timeout 1000`).
    pub fn start_with_replicas() -> Self {
        let nodes: Vec<RedisServer> = (0..6).map(|_| RedisServer::start_any(true)).collect();
        for n in &nodes {
            n.cli(&["config", "set", "cluster-node-timeout", "1000"]);
        }
        Self::create(nodes, 1)
    }

    /// The port of the master serving `key`'s slot, as `node` sees it
    /// (none while its master has failed and no replica has taken over).
    pub fn master_of(&self, node: usize, key: &str) -> Option<u16> {
        let slot: u16 = self.nodes[node]
            .cli(&["cluster", "keyslot", key])
            .parse()
            .unwrap();
        for line in self.nodes[node].cli(&["cluster", "nodes"]).lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            let serves = f[8..].iter().any(|r| match r.split_once('-') {
                Some((a, b)) => {
                    (a.parse().unwrap_or(u16::MAX)..=b.parse().unwrap_or(0)).contains(&slot)
                }
                None => r.parse() == Ok(slot),
            });
            if serves {
                let port = f[1].split('@').next().unwrap().rsplit(':').next().unwrap();
                return port.parse().ok();
            }
        }
        None
    }

    fn of(nodes: Vec<RedisServer>) -> Self {
        Self::create(nodes, 0)
    }

    fn create(nodes: Vec<RedisServer>, replicas: u8) -> Self {
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &nodes {
            while !n.cli(&["cluster", "info"]).contains("cluster_state:ok") {
                assert!(Instant::now() < deadline, "cluster did not become ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Replicas in sync with their masters before anyone relies on them.
        for n in &nodes {
            loop {
                let info = n.cli(&["info", "replication"]);
                if info.contains("role:master") || info.contains("master_link_status:up") {
                    break;
                }
                assert!(Instant::now() < deadline, "replica never synced");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Self { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// `store:` for a gateway on this cluster, in YAML's flow form.
    pub fn store_yaml(&self) -> String {
        let seeds: Vec<String> = self.urls().iter().map(|u| format!("'{u}'")).collect();
        format!("{{type: redis, cluster: [{}]}}", seeds.join(", "))
    }
}
pub mod fault;
pub mod netns;
