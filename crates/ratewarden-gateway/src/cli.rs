//! The `ratewarden` command: parse the command line, load the
//! configuration, start the server, wait for a signal. (In the library,
//! not the binary: the generic code it instantiates, tokio's runtime and
//! tracing's subscriber among it, is compiled once, here, rather than
//! again in the binary's own crate.)

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{self, Config, Overrides, Upstream};
use crate::gateway;
use crate::server::{self, Source};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ratewarden",
    version,
    about = "A rate-limiting reverse proxy, exact under concurrency"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    ///
    /// On SIGHUP, and when the config file (or a TLS or RLS file it names)
    /// changes (checked twice a second), the config is read again: a valid
    /// one is swapped in without dropping connections, an invalid one is
    /// logged and the old one keeps running. SIGTERM or SIGINT stops
    /// accepting, lets in-flight requests finish (at most 30 s), writes out
    /// the access log and exits.
    Serve {
        /// Config file (default: ./ratewarden.yaml if present, else the built-in example).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Overrides `listen:`.
        #[arg(long)]
        listen: Option<String>,
        /// Overrides `admin.listen:`.
        #[arg(long)]
        admin_listen: Option<String>,
        /// Overrides `upstream:` (`echo` for the built-in echo upstream).
        #[arg(long)]
        upstream: Option<String>,
        /// Overrides `workers:` (threads serving requests).
        #[arg(long)]
        workers: Option<usize>,
    },
    /// API keys for `consumers:`: `key new` makes one, `key hash` hashes
    /// one read from stdin. Each prints the key's hash under `key_secret`
    /// (what `consumers.file`'s `key_hash` takes): from the config's
    /// `key_secret` with `--config`, else from $RATEWARDEN_KEY_SECRET.
    Key {
        /// `new` or `hash`.
        #[arg(value_parser = ["new", "hash"])]
        action: String,
        /// Config file whose `key_secret` hashes the key.
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// Check a config file; exit 0 if valid, 2 if not.
    Validate {
        /// The file.
        file: PathBuf,
    },
    /// Replay a traffic pattern through the configured rules (the real
    /// admission path, on a manual clock): a summary table, and with
    /// `--out` a time series per rule as CSV and pictures as PNG and SVG.
    Simulate {
        /// Config file (default: ./ratewarden.yaml if present, else the built-in example).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// A trace (CSV or JSONL: `t, identity, method, path[, status]`;
        /// JSONL lines may add `host` and `headers`) or generators joined
        /// by `+`:
        ///
        ///   steady:rate=N        N requests a second, evenly
        ///   poisson:rate=N       N a second on average, random gaps
        ///   burst:size=N,every=D N at once, every D (default 10s)
        ///   sawtooth:peak=N,period=D   rising to N a second over each D
        ///   attack:rate=N        N a second, spread over many clients
        ///
        /// Every generator also takes duration=D (default 60s), start=D,
        /// method=M, path=P, status=S (the upstream's answer), seed=N,
        /// clients=N, host=H and header:NAME=V.
        /// Example: `steady:rate=50,duration=60s+burst:size=100,every=10s`.
        #[arg(short, long, verbatim_doc_comment)]
        traffic: String,
        /// Algorithms to replay the same traffic under as well, each
        /// replacing every rule's (comma-separated).
        #[arg(long, value_delimiter = ',')]
        compare: Vec<String>,
        /// Directory for series.csv and the pictures.
        #[arg(long)]
        out: Option<PathBuf>,
        /// The series' resolution (default: about 120 steps), e.g. `100ms`.
        #[arg(long, value_parser = config::parse_duration)]
        step: Option<std::time::Duration>,
    },
    /// Ask a running gateway's admin API whether it is healthy (`GET
    /// /healthz`, plain HTTP); exit 0 if it answers 200 within 2 s, 1 if
    /// not. For container healthchecks, where there is no curl.
    Healthcheck {
        /// The admin listener's address.
        #[arg(default_value = "127.0.0.1:9090")]
        admin: String,
    },
}

/// `GET /healthz` on `addr`: whether it answered 200 within 2 s.
/// `GET /healthz` on `addr`: `Ok` on a 200, else why not (for stderr: a
/// failing container healthcheck should say what failed).
fn healthy(addr: &str) -> Result<(), String> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    use std::time::Duration;
    let resolved = addr
        .to_socket_addrs()
        .map_err(|e| format!("{addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr}: no address"))?;
    let t = Duration::from_secs(2);
    let mut s = std::net::TcpStream::connect_timeout(&resolved, t)
        .map_err(|e| format!("cannot connect to {resolved}: {e}"))?;
    let _ = s.set_read_timeout(Some(t));
    let _ = s.set_write_timeout(Some(t));
    s.write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .map_err(|e| format!("cannot send to {resolved}: {e}"))?;
    // The answer is short: its head and a body of a few bytes.
    let mut answer = Vec::new();
    let _ = s.take(4096).read_to_end(&mut answer);
    if answer.starts_with(b"HTTP/1.1 200") || answer.starts_with(b"HTTP/1.0 200") {
        return Ok(());
    }
    if answer.is_empty() {
        return Err(format!(
            "{resolved} closed the connection without an answer"
        ));
    }
    let text = String::from_utf8_lossy(&answer);
    let status = text.lines().next().unwrap_or_default().to_owned();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).trim();
    Err(format!("GET /healthz on {resolved}: {status}: {body}"))
}

/// The configuration, the file it came from and the text it was parsed from.
type Loaded = (Config, Option<PathBuf>, String);

fn load(path: Option<&PathBuf>, overrides: &Overrides) -> Result<Loaded, ExitCode> {
    let (text, name, path) = match path {
        Some(p) => match std::fs::read_to_string(p) {
            Ok(t) => (t, p.display().to_string(), Some(p.clone())),
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", p.display());
                return Err(ExitCode::from(2));
            }
        },
        None => (config::EMBEDDED.to_owned(), "<built-in>".to_owned(), None),
    };
    match config::load(&text, &name, overrides) {
        Ok(c) => Ok((c, path, text)),
        Err(errors) => {
            for e in errors.all() {
                eprintln!("error: {e}");
            }
            Err(ExitCode::from(2))
        }
    }
}

/// `ratewarden key new|hash`: a key (made, or read from stdin) and its
/// hash under the config's `key_secret` (or $RATEWARDEN_KEY_SECRET).
fn key(action: &str, config: Option<&PathBuf>) -> ExitCode {
    let hasher = match config {
        Some(path) => match load(Some(path), &Overrides::default()) {
            Ok((c, _, _)) => match c.consumers {
                Some(spec) => spec.hasher,
                None => {
                    eprintln!(
                        "{}: no `consumers:` section (and so no key hash to make)",
                        path.display()
                    );
                    return ExitCode::from(2);
                }
            },
            Err(code) => return code,
        },
        None => match std::env::var("RATEWARDEN_KEY_SECRET") {
            Ok(s) if s.len() >= 16 => crate::tls::key_hasher(s.as_bytes()),
            _ => {
                eprintln!(
                    "give --config FILE (its key_secret), or set RATEWARDEN_KEY_SECRET (at least 16 bytes)"
                );
                return ExitCode::from(2);
            }
        },
    };
    match action {
        "new" => {
            let key = crate::tls::new_api_key();
            println!("key:      {key}");
            println!("key_hash: \"{}\"", hasher.hash(&key));
            eprintln!("the key is shown once: give it to its consumer; keep only key_hash");
        }
        _ => {
            let mut line = String::new();
            if std::io::stdin().read_line(&mut line).is_err() || line.trim().is_empty() {
                eprintln!("give the key on stdin: echo -n KEY | ratewarden key hash");
                return ExitCode::from(2);
            }
            println!("key_hash: \"{}\"", hasher.hash(line.trim()));
        }
    }
    ExitCode::SUCCESS
}

/// The command's `main`: what it did, as its exit status.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Healthcheck { admin } => match healthy(&admin) {
            Ok(()) => ExitCode::SUCCESS,
            Err(why) => {
                eprintln!("unhealthy: {why}");
                ExitCode::FAILURE
            }
        },
        Command::Key { action, config } => key(&action, config.as_ref()),
        Command::Validate { file } => match load(Some(&file), &Overrides::default()) {
            Ok((c, _, text)) => {
                // Loading does no network I/O; `validate` fetches the
                // `jwks_url` to check it, as `serve` will before it serves.
                if let Some(Err(e)) = c.jwt.as_ref().map(crate::jwt::Verifier::fetch_now) {
                    eprintln!("{}: jwt.jwks_url: {e}", file.display());
                    return ExitCode::FAILURE;
                }
                let n = c.policy.rules.len();
                let rls = c.rls.as_ref().map_or(String::new(), |r| {
                    let d = r.domains.len();
                    format!(", {d} RLS domain{}", if d == 1 { "" } else { "s" })
                });
                println!(
                    "{}: valid ({n} rule{}{rls}, upstream {})",
                    file.display(),
                    if n == 1 { "" } else { "s" },
                    c.upstream
                );
                if n == 0 {
                    eprintln!(
                        "warning: {} has no `rules:`: nothing is limited by it (the built-in \
                         defaults apply only when no file is given)",
                        file.display()
                    );
                }
                // What the gateway will do with it: each rule as it was
                // read (a seed-002 file, translated, most of all).
                let banner = gateway::banner(&c);
                if text
                    .lines()
                    .any(|l| l.trim_end().starts_with("rateLimiter:"))
                {
                    println!("read as the seed-002 gateway's format, translated to:");
                }
                println!("  store: {}", banner.store);
                for r in &banner.rules {
                    println!("  rule {r}");
                }
                for l in &banner.rls {
                    println!("  rls limit {l}");
                }
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Command::Simulate {
            config,
            traffic,
            compare,
            out,
            step,
        } => {
            let default = PathBuf::from("ratewarden.yaml");
            let path = config.or_else(|| default.exists().then_some(default));
            // Nothing is proxied: the upstream a file names (or not) is
            // not asked for.
            let replay = Overrides {
                upstream: Some("echo".into()),
                ..Overrides::default()
            };
            let (cfg, _, _) = match load(path.as_ref(), &replay) {
                Ok(x) => x,
                Err(code) => return code,
            };
            let opts = crate::simulate::Options {
                traffic,
                compare,
                out,
                step,
                progress: true,
            };
            match crate::simulate::simulate(&cfg, &opts) {
                Ok(report) => {
                    print!("{}", report.summary);
                    for f in &report.files {
                        println!("wrote {}", f.display());
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Serve {
            config,
            listen,
            admin_listen,
            upstream,
            workers,
        } => {
            let overrides = Overrides {
                listen,
                admin_listen,
                upstream,
                workers,
            };
            let default = PathBuf::from("ratewarden.yaml");
            let path = config.or_else(|| default.exists().then_some(default));
            let (cfg, path, text) = match load(path.as_ref(), &overrides) {
                Ok(x) => x,
                Err(code) => return code,
            };
            init_log(&cfg.log);
            // One worker: a current-thread runtime, like one nginx worker
            // process (no work-stealing queues, no cross-thread wakeups).
            let rt = if cfg.workers == 1 {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
            } else {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(cfg.workers)
                    .enable_all()
                    .build()
            };
            let rt = match rt {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            rt.block_on(run(
                cfg,
                Source {
                    loaded: path.is_some().then_some(text),
                    path,
                    overrides,
                    clock: None,
                },
            ))
        }
    }
}

/// The log as `log:` says (`RUST_LOG` wins over its level, when it reads
/// as a filter); colours only on a terminal (and never with `NO_COLOR`),
/// so files get plain text.
fn init_log(spec: &config::LogSpec) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| config::log_filter(&v).ok())
        .or_else(|| config::log_filter(&spec.level).ok())
        .unwrap_or_default();
    let ansi = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt::layer().with_ansi(ansi);
    let registry = tracing_subscriber::registry().with(filter);
    match spec.format {
        config::LogFormat::Text => registry.with(fmt).init(),
        config::LogFormat::Json => registry
            .with(
                fmt.json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(false),
            )
            .init(),
    }
}

async fn run(cfg: Config, source: Source) -> ExitCode {
    let banner = gateway::banner(&cfg);
    // The hint for a first run is for a person at a terminal; a JSON log
    // stays JSON lines only.
    let echo = cfg.upstream == Upstream::Echo && cfg.log.format == config::LogFormat::Text;
    // curl must be shown the certificate when it is not from a public CA
    // (a self-signed one is its own), or it prints nothing but an error.
    let cacert = cfg
        .tls
        .as_ref()
        .and_then(|t| t.files.first())
        .map(|f| format!("--cacert {} ", f.display()))
        .unwrap_or_default();
    let cfg_consumers = cfg.consumers.clone();
    let running = match server::start(cfg, source).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let scheme = if banner.tls { "https" } else { "http" };
    tracing::info!(
        listen = %running.proxy.map_or("off".to_owned(), |a| a.to_string()),
        tls = banner.tls,
        admin = %running.admin.map_or("off".to_owned(), |a| a.to_string()),
        rls = %running.rls.map_or("off".to_owned(), |a| a.to_string()),
        authz = %running.authz.map_or("off".to_owned(), |a| a.to_string()),
        upstream = %banner.upstream,
        store = %banner.store,
        rules = banner.rules.len(),
        "ratewarden serving"
    );
    for r in &banner.rules {
        tracing::info!("rule {r}");
    }
    for l in &banner.rls {
        tracing::info!("rls limit {l}");
    }
    if let (Some(authz), true) = (running.authz, echo || running.proxy.is_none()) {
        // A gateway for a proxy's hook: the try-line asks the hook.
        let proxy = match running.proxy {
            Some(p) => format!("the proxy listener on {p} answers from the built-in echo upstream"),
            None => "no proxy listener: `listen: off`".to_owned(),
        };
        println!(
            "ratewarden: the authorisation listener on http://{authz} ({proxy}).\n\
             try: for i in $(seq 105); do curl -s -o /dev/null -w '%{{http_code}}\\n' -H 'X-Original-Method: GET' -H 'X-Original-URI: /' -H 'X-Forwarded-For: 192.0.2.1' http://{authz}/authz/nginx; done"
        );
    } else if let (Some(listen), true) = (running.proxy, echo) {
        let rules = if banner.rules.is_empty() {
            "no rules".to_owned()
        } else {
            banner.rules.join("; ")
        };
        println!(
            "ratewarden: {scheme}://{listen} in front of the built-in echo upstream ({rules}).\n\
             try: for i in $(seq 105); do curl -si {cacert}{scheme}://{listen}/ | grep -iE '^(HTTP|x-ratelimit-remaining|retry-after)'; done"
        );
        // With consumers, requests need a key: the line says how to make one.
        if let (Some(spec), Some(admin)) = (&cfg_consumers, running.admin) {
            let how = match &spec.from {
                crate::config::ApiKeyFrom::Header(h) => format!("-H '{h}: KEY'"),
                crate::config::ApiKeyFrom::Authorization => {
                    "-H 'Authorization: Bearer KEY'".to_owned()
                }
                crate::config::ApiKeyFrom::Query(q) => format!("(and ?{q}=KEY)"),
            };
            println!(
                "     requests need an API key: curl -s -XPOST http://{admin}/v1/consumers -d '{{\"name\":\"demo\"}}' \
                 prints one as \"key\"; add {how} to the curl above"
            );
        }
        if !cacert.is_empty() {
            println!(
                "     (--cacert: for a self-signed certificate or a private CA's; if the certificate \
                 names a host rather than {}, add --resolve HOST:{}:{} and ask https://HOST:{}/)",
                listen.ip(),
                listen.port(),
                listen.ip(),
                listen.port()
            );
        }
    }
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot watch SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down: finishing in-flight requests");
    let started = std::time::Instant::now();
    running.shutdown().await;
    tracing::info!(took = ?started.elapsed(), "stopped");
    ExitCode::SUCCESS
}
