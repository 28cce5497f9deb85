//! `ratewarden`: the gateway binary; the command is
//! [`ratewarden_gateway::cli`].

use std::process::ExitCode;

/// A request allocates and frees dozens of small buffers (headers, bodies,
/// decisions); mimalloc's thread-local free lists serve them faster than
/// glibc's malloc, which spent ~9% of the rejection path in malloc/free.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    ratewarden_gateway::cli::main()
}
