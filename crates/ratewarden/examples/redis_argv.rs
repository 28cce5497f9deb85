//! For bench/redis_cpu.sh: writes the store's script (and, given a second
//! path, its Functions library, whose function's name goes to stderr) to a
//! file and prints,
//! for each algorithm, how many keys and the ARGV of one apply call of one
//! op of cost 1 (limit 1e6 per second: never rejecting), in the compact
//! form the store sends it (`script::argv_one`: one key, or two where the
//! algorithm keeps a zset), as redis-benchmark takes them.
//! Not `concurrency`: its leases, never released here, would pile up.
//!
//!     cargo run --release -p ratewarden --example redis_argv -- SCRIPT.lua [LIBRARY.lua]
//!
//! Prints `ALGORITHM KEYS ARG ARG ...` per line.

use std::time::Duration;

use ratewarden::algorithm::Kind;
use ratewarden::clock::Micros;
use ratewarden::store::redis::script::{SCRIPT, argv_one, keeps_zset};
use ratewarden::{Op, Rule};

fn main() {
    let Some(out) = std::env::args().nth(1) else {
        eprintln!("usage: redis_argv SCRIPT.lua");
        std::process::exit(2);
    };
    std::fs::write(&out, SCRIPT).unwrap_or_else(|e| panic!("{out}: {e}"));
    if let Some(lib) = std::env::args().nth(2) {
        let (library, name) = ratewarden::store::redis::script::library();
        std::fs::write(&lib, library).unwrap_or_else(|e| panic!("{lib}: {e}"));
        eprintln!("{name}");
    }
    for kind in Kind::ALL.into_iter().filter(|k| *k != Kind::Concurrency) {
        let rule = Rule::builder(kind.name())
            .algorithm(kind)
            .limit(1_000_000, Duration::from_secs(1))
            .build()
            .expect("a rule");
        // (The spec is one argument without spaces: the bench splits on them.)
        let args = argv_one(&Op::new(&rule, "k"), 1, Micros::ZERO, Micros::ZERO);
        let keys = if keeps_zset(&rule) { 2 } else { 1 };
        println!("{} {keys} {}", kind.name(), args.join(" "));
    }
}
