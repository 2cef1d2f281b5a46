//! `dlcast-stubgen`: writes a `.pyi` stub for a Python extension module built
//! with dlcast. The generator is a Python program (it imports the module and
//! reads the signature lines `#[dlpack_fn]` writes); this binary carries it
//! and runs it with the user's interpreter, so that no checkout of dlcast is
//! needed.
//!
//! ```text
//! dlcast-stubgen [--python PYTHON] MODULE [-o DIR]
//! dlcast-stubgen --write-script DIR
//! ```

use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The generator (`dlcast_stubgen.py`), standard library only.
const GENERATOR: &str = include_str!("../dlcast_stubgen.py");

const USAGE: &str = "usage: dlcast-stubgen [--python PYTHON] MODULE [-o DIR]\n       \
                     dlcast-stubgen --write-script DIR\n\n\
                     Imports MODULE with PYTHON (default: $PYTHON, else python3) and writes\n\
                     DIR/MODULE.pyi (default DIR: .); --write-script writes the generator\n\
                     itself as DIR/dlcast_stubgen.py.";

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return if args.is_empty() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
    }
    if args[0] == "--write-script" {
        let Some(dir) = args.get(1) else {
            eprintln!("{USAGE}");
            return ExitCode::FAILURE;
        };
        let path = PathBuf::from(dir).join("dlcast_stubgen.py");
        return match std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, GENERATOR)) {
            Ok(()) => {
                println!("wrote {}", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("dlcast-stubgen: cannot write {}: {e}", path.display());
                ExitCode::FAILURE
            }
        };
    }
    let mut python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    if args[0] == "--python" {
        if args.len() < 2 {
            eprintln!("{USAGE}");
            return ExitCode::FAILURE;
        }
        python = args.remove(1);
        args.remove(0);
    }
    // `python -c` runs the generator as `__main__`; the remaining arguments
    // are its own (MODULE, -o DIR).
    match Command::new(&python)
        .arg("-c")
        .arg(GENERATOR)
        .args(&args)
        .status()
    {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => ExitCode::from(u8::try_from(status.code().unwrap_or(1)).unwrap_or(1)),
        Err(e) => {
            eprintln!("dlcast-stubgen: cannot run {python}: {e} (set --python or $PYTHON)");
            ExitCode::FAILURE
        }
    }
}
