//! `abhyasa`: the command (see the `abhyasa-cli` crate).

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    abhyasa_cli::main()
}
