//! One way for every binary to take its options: flags, then environment variables, then a config
//! file, then the defaults — each source used only for what the ones before it left unset.
//!
//! A binary declares its options once, as a clap `Parser`, with a `--config FILE` option among them,
//! and calls [`parse`] with its environment prefix. Every visible option `--some-thing` can then also
//! be given as the variable `PREFIX_SOME_THING` and as `some_thing = …` (or `some-thing`) in the
//! TOML config file named by `--config` or `PREFIX_CONFIG`. Values from all three sources go through
//! the same clap value parsers, so a bad value is refused with the option named, wherever it came
//! from; an unknown key in the file is refused too (a typo must not silently fall back to a default).
//!
//! A binary with subcommands takes the options of the subcommand named on the command line the same
//! way (`PREFIX_SOME_THING`, `some_thing = …`): a file key is looked up among the top-level options
//! first, then among that subcommand's.
//!
//! Deliberately left out: hidden options (test-only negative controls) get no environment variable,
//! so a stray variable can never switch off a safety rule; they can still be set in the file, as on
//! the command line. Nested subcommands (a subcommand of a subcommand) read no file keys.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{ArgAction, CommandFactory, Parser};

/// The name of the option that names the config file (every binary has it).
const CONFIG: &str = "config";

/// Parses the process's arguments, environment and config file, or prints the error (or the help)
/// and exits the way clap does.
pub fn parse<T: Parser>(env_prefix: &str) -> T {
    try_parse_from(env_prefix, std::env::args_os()).unwrap_or_else(|e| e.exit())
}

/// [`parse`] over given arguments (the first is the program name); reads the process environment.
pub fn try_parse_from<T, I, A>(env_prefix: &str, args: I) -> Result<T, clap::Error>
where
    T: Parser,
    I: IntoIterator<Item = A>,
    A: Into<OsString>,
{
    let mut cmd = command::<T>(env_prefix);
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let args = match config_path(&cmd, &args) {
        Some(path) => with_file(&cmd, args, &path).map_err(|msg| cmd.error(ErrorKind::ValueValidation, msg))?,
        None => args,
    };
    let mut matches = cmd.try_get_matches_from_mut(args)?;
    T::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut cmd))
}

/// Parses `90s`, `5m`, `1500ms`, `1h` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 90s or 5m"))?;
    let d = match unit {
        "" | "s" => std::time::Duration::from_secs(n),
        "ms" => std::time::Duration::from_millis(n),
        "m" | "h" => {
            let per = if unit == "m" { 60 } else { 3600 };
            std::time::Duration::from_secs(n.checked_mul(per).ok_or_else(|| format!("{s:?} is too long"))?)
        }
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h)")),
    };
    if d.is_zero() {
        return Err("duration must be positive".into());
    }
    Ok(d)
}

/// The binary's command with an environment variable on every visible option (also those of its
/// subcommands).
pub fn command<T: CommandFactory>(env_prefix: &str) -> clap::Command {
    with_env(T::command(), env_prefix)
}

fn with_env(cmd: clap::Command, prefix: &str) -> clap::Command {
    let p = prefix.to_string();
    let cmd = cmd.mut_args(move |a| {
        let skip = a.is_positional() || a.is_hide_set() || a.get_env().is_some() || a.get_long().is_none();
        if skip || matches!(a.get_action(), ArgAction::Help | ArgAction::Version) {
            return a;
        }
        let name = env_name(&p, a.get_long().unwrap_or_default());
        a.env(name)
    });
    let p = prefix.to_string();
    cmd.mut_subcommands(move |sc| with_env(sc, &p))
}

fn env_name(prefix: &str, long: &str) -> String {
    format!("{prefix}_{}", long.to_uppercase().replace('-', "_"))
}

/// `--config FILE` / `--config=FILE` on the command line, else the option's environment variable.
fn config_path(cmd: &clap::Command, args: &[OsString]) -> Option<PathBuf> {
    let flag = format!("--{CONFIG}");
    let prefix = format!("--{CONFIG}=");
    for (i, a) in args.iter().enumerate().skip(1) {
        let a = a.to_string_lossy();
        if a == "--" {
            break;
        }
        if let Some(p) = a.strip_prefix(&prefix) {
            return Some(p.into());
        }
        if a == flag {
            return args.get(i + 1).map(PathBuf::from);
        }
    }
    let arg = cmd.get_arguments().find(|a| a.get_long() == Some(CONFIG))?;
    arg.get_env().and_then(std::env::var_os).map(PathBuf::from)
}

/// The arguments with the file's options put in front of those given, for every option that
/// neither the command line nor the environment sets.
fn with_file(cmd: &clap::Command, args: Vec<OsString>, path: &PathBuf) -> Result<Vec<OsString>, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read config file {shown}: {e}"))?;
    let table: toml::Table = text.parse().map_err(|e| format!("config file {shown}: {e}"))?;
    let given = given_longs(cmd, &args);
    let sub = subcommand_at(cmd, &args);
    let mut top = Vec::new();
    let mut in_sub = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let find = |c: &clap::Command| c.get_arguments().find(|a| a.get_long() == Some(long.as_str())).cloned();
        let (arg, out) = match (find(cmd), sub.and_then(|(_, sc)| find(sc))) {
            (Some(a), _) if long != CONFIG => (a, &mut top),
            (None, Some(a)) => (a, &mut in_sub),
            _ => return Err(format!("config file {shown}: unknown option {key:?}")),
        };
        let from_env = arg.get_env().is_some_and(|v| std::env::var_os(v).is_some());
        if given.contains(&long) || from_env {
            continue;
        }
        let set_true = matches!(arg.get_action(), ArgAction::SetTrue);
        out.extend(file_values(&long, value, set_true).map_err(|e| format!("config file {shown}: {key}: {e}"))?);
    }
    // Top-level options go right after the program name, a subcommand's right after its name.
    let at_sub = sub.map_or(args.len(), |(i, _)| i + 1);
    let mut out = Vec::with_capacity(args.len() + top.len() + in_sub.len());
    out.extend(args[..1].iter().cloned());
    out.extend(top.into_iter().map(OsString::from));
    out.extend(args[1..at_sub].iter().cloned());
    out.extend(in_sub.into_iter().map(OsString::from));
    out.extend(args[at_sub..].iter().cloned());
    Ok(out)
}

/// The position and command of the subcommand named on the command line, if any: the first
/// argument that names one.
fn subcommand_at<'c>(cmd: &'c clap::Command, args: &[OsString]) -> Option<(usize, &'c clap::Command)> {
    args.iter()
        .enumerate()
        .skip(1)
        .take_while(|(_, a)| *a != "--")
        .find_map(|(i, a)| cmd.find_subcommand(a).map(|sc| (i, sc)))
}

/// The long names of the options present on the command line (`--name`, `--name=v`, or a short of
/// a top-level option).
fn given_longs(cmd: &clap::Command, args: &[OsString]) -> Vec<String> {
    let mut out = Vec::new();
    for a in args.iter().skip(1).map(|a| a.to_string_lossy()) {
        if a == "--" {
            break;
        }
        if let Some(long) = a.strip_prefix("--") {
            out.push(long.split('=').next().unwrap_or_default().to_string());
        } else if let Some(short) = a.strip_prefix('-').and_then(|s| s.chars().next()) {
            let long = cmd
                .get_arguments()
                .find(|x| x.get_short() == Some(short))
                .and_then(|x| x.get_long());
            out.extend(long.map(str::to_string));
        }
    }
    out
}

/// One TOML value as `--long=value` arguments (an array gives one per element).
fn file_values(long: &str, value: &toml::Value, set_true: bool) -> Result<Vec<String>, String> {
    let one = |v: &toml::Value| -> Result<String, String> {
        match v {
            toml::Value::String(s) => Ok(s.clone()),
            toml::Value::Integer(i) => Ok(i.to_string()),
            toml::Value::Float(f) => Ok(f.to_string()),
            toml::Value::Boolean(b) => Ok(b.to_string()),
            other => Err(format!("a {} is not an option value", other.type_str())),
        }
    };
    match value {
        toml::Value::Boolean(b) if set_true => Ok(if *b { vec![format!("--{long}")] } else { vec![] }),
        toml::Value::Array(items) => items.iter().map(|v| Ok(format!("--{long}={}", one(v)?))).collect(),
        v => Ok(vec![format!("--{long}={}", one(v)?)]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in binary with the kinds of options the real ones have.
    #[derive(Parser, Debug)]
    #[command(name = "demo")]
    struct Demo {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        node_id: u64,
        #[arg(long, default_value_t = 500)]
        renew_interval_ms: u64,
        #[arg(long, value_delimiter = ',')]
        peers: Vec<seqsvr_proto::addr::IdAddr>,
        #[arg(long)]
        listen: Option<seqsvr_proto::addr::HostPort>,
        #[arg(long)]
        bootstrap: bool,
        #[arg(long, hide = true)]
        unsafe_thing: bool,
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    fn parse(prefix: &str, args: &[&str]) -> Result<Demo, String> {
        try_parse_from::<Demo, _, _>(prefix, std::iter::once("demo").chain(args.iter().copied()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_file_fills_what_flags_leave_unset() {
        let f = file(
            "node_id = 3\nrenew-interval-ms = 250\npeers = [\"1=a:1\", \"2=b:2\"]\nbootstrap = true\nunsafe_thing = false\n",
        );
        let path = f.path().to_str().unwrap();
        let d = parse("DEMO_A", &["--config", path, "--node-id", "7"]).unwrap();
        assert_eq!((d.node_id, d.renew_interval_ms, d.peers.len()), (7, 250, 2));
        assert!(d.bootstrap && !d.unsafe_thing);
        let d = parse("DEMO_A", &[&format!("--config={path}")]).unwrap();
        assert_eq!(d.node_id, 3);
    }

    #[test]
    fn the_environment_sits_between_flags_and_the_file() {
        let f = file("node_id = 3\nrenew_interval_ms = 250\n");
        // SAFETY: variables with a prefix no other test uses; tests in this module do not read them.
        unsafe {
            std::env::set_var("DEMO_B_RENEW_INTERVAL_MS", "125");
            std::env::set_var("DEMO_B_CONFIG", f.path());
            std::env::set_var("DEMO_B_UNSAFE_THING", "true");
        }
        let d = parse("DEMO_B", &[]).unwrap();
        assert_eq!((d.node_id, d.renew_interval_ms), (3, 125), "env beats the file");
        assert!(!d.unsafe_thing, "hidden options have no environment variable");
        let d = parse("DEMO_B", &["--renew-interval-ms", "60"]).unwrap();
        assert_eq!(d.renew_interval_ms, 60, "flags beat the environment");
    }

    #[test]
    fn bad_values_name_the_option_wherever_they_come_from() {
        let cases = [
            ("listen = \"nowhere\"\nnode_id = 1\n", "--listen"),
            ("node_id = \"x\"\n", "--node-id"),
            ("node_id = 1\nlisten_addr = \"a:1\"\n", "listen_addr"),
            ("node_id = 1\npeers = [\"0=a:1\"]\n", "--peers"),
            ("node_id = {}\n", "node_id"),
            ("node_id = ", "config file"),
        ];
        for (text, named) in cases {
            let f = file(text);
            let e = parse("DEMO_C", &["--config", f.path().to_str().unwrap()]).unwrap_err();
            assert!(e.contains(named), "{text:?}: {e}");
        }
        let e = parse("DEMO_C", &["--config", "/nonexistent/seqsvr.toml"]).unwrap_err();
        assert!(e.contains("cannot read config file"), "{e}");
    }

    /// A stand-in binary with subcommands, like `sim` and `seqctl`.
    #[derive(Parser, Debug)]
    #[command(name = "tool")]
    struct Tool {
        #[arg(long, global = true)]
        config: Option<PathBuf>,
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        cmd: ToolCmd,
    }

    #[derive(clap::Subcommand, Debug)]
    enum ToolCmd {
        Run {
            #[arg(long, default_value_t = 1)]
            seed: u64,
            #[arg(long)]
            clients: Option<u32>,
        },
        Check {
            file: PathBuf,
        },
    }

    #[test]
    fn a_subcommand_takes_its_options_from_the_file_and_the_environment() {
        let f = file("json = true\nseed = 42\n");
        let path = f.path().to_str().unwrap();
        // SAFETY: a variable no other test uses.
        unsafe { std::env::set_var("TOOL_E_CLIENTS", "7") };
        let t = try_parse_from::<Tool, _, _>("TOOL_E", ["tool", "run", "--config", path]).unwrap();
        assert!(t.json);
        assert!(
            matches!(
                t.cmd,
                ToolCmd::Run {
                    seed: 42,
                    clients: Some(7)
                }
            ),
            "{:?}",
            t.cmd
        );
        let t = try_parse_from::<Tool, _, _>("TOOL_E", ["tool", "--config", path, "run", "--seed", "5"]).unwrap();
        assert!(matches!(t.cmd, ToolCmd::Run { seed: 5, .. }), "{:?}", t.cmd);
        // A key of another subcommand's is unknown here.
        let e = try_parse_from::<Tool, _, _>("TOOL_E", ["tool", "check", "x", "--config", path]).unwrap_err();
        assert!(e.to_string().contains("unknown option \"seed\""), "{e}");
    }

    #[test]
    fn help_shows_the_environment_variables() {
        let help = command::<Demo>("DEMO_D").render_long_help().to_string();
        assert!(
            help.contains("DEMO_D_NODE_ID") && help.contains("DEMO_D_CONFIG"),
            "{help}"
        );
        assert!(!help.contains("UNSAFE"), "{help}");
    }
}
