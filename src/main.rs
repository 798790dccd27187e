//! `abhyasa`: the command (see the `abhyasa-cli` crate).

fn main() -> std::process::ExitCode {
    abhyasa_cli::main()
}
