//! `paraid`: create, assemble and serve RAID arrays whose parity runs on a GPU or CPU SIMD.

mod admin;
mod cli;
mod commands;
mod control;
mod demo;
mod export;
mod held;
mod manage;
mod metrics;
mod monitor;
mod prometheus;
mod signals;
mod status_text;
mod units;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    if !matches!(cli.command, cli::Command::Serve(_) | cli::Command::Demo(_)) {
        // Commands that only print end quietly when their reader goes away (`paraid status --json | head`),
        // like other Unix tools. The server keeps Rust's default (SIGPIPE ignored): a client hanging up is an
        // error on that connection, not the end of the process.
        // SAFETY: restoring the default disposition of a signal before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let default_level = match cli.verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_level))
        .format_timestamp_millis()
        .init();
    let json = cli.command.json();
    let outcome = match cli.command {
        cli::Command::Create(args) => commands::create(args),
        cli::Command::Serve(args) => commands::serve(args),
        cli::Command::Examine(args) => commands::examine(args),
        cli::Command::Detail(args) => commands::detail(args),
        cli::Command::Demo(args) => demo::run(args),
        cli::Command::Status(args) => admin::status(args),
        cli::Command::Metrics(args) => admin::metrics(args),
        cli::Command::Fail(args) => admin::fail(args),
        cli::Command::Remove(args) => admin::remove(args),
        cli::Command::Add(args) => admin::add(args),
        cli::Command::Replace(args) => admin::replace(args),
        cli::Command::Check(args) => admin::check(args),
        cli::Command::Speed(args) => admin::speed(args),
        cli::Command::Stop(args) => admin::stop(args),
        cli::Command::Monitor(args) => monitor::run(args),
        cli::Command::UblkDelete(args) => commands::ublk_delete(args),
        cli::Command::ZeroSuperblock(args) => commands::zero_superblock(args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            // One clear line per failure: scripts and people both read it.
            eprintln!("paraid: error: {message}");
            if json {
                // A script that asked for JSON reads the failure as JSON too (the control socket's form).
                println!("{}", serde_json::json!({ "ok": false, "error": message }));
            }
            ExitCode::FAILURE
        }
    }
}
