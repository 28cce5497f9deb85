//! `ratewarden`: the gateway binary. Thin: parse the command line, load the
//! configuration, start the library's server, wait for a signal.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ratewarden_gateway::config::{self, Config, Overrides, Upstream};
use ratewarden_gateway::server::{self, Source};

/// A request allocates and frees dozens of small buffers (headers, bodies,
/// decisions); mimalloc's thread-local free lists serve them faster than
/// glibc's malloc, which spent ~9% of the rejection path in malloc/free.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Check a config file; exit 0 if valid, 2 if not.
    Validate {
        /// The file.
        file: PathBuf,
    },
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { file } => match load(Some(&file), &Overrides::default()) {
            Ok((c, _, _)) => {
                println!(
                    "{}: valid ({} rules, upstream {})",
                    file.display(),
                    c.policy.rules.len(),
                    c.upstream
                );
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
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
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .init();
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

async fn run(cfg: Config, source: Source) -> ExitCode {
    let echo = cfg.upstream == Upstream::Echo;
    let running = match server::start(cfg, source).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(listen = %running.listen, admin = ?running.admin, "ratewarden serving");
    if echo {
        println!(
            "ratewarden: http://{} in front of the built-in echo upstream (100 requests/minute per client).\n\
             try: for i in $(seq 105); do curl -si {}/ | grep -iE '^(HTTP|x-ratelimit-remaining|retry-after)'; done",
            running.listen, running.listen
        );
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
    running.shutdown().await;
    ExitCode::SUCCESS
}
