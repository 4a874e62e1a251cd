fn main() {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_writer(std::io::stderr).init();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("shim") {
        std::process::exit(wharf_runtime::shim::main(std::path::Path::new(&args[2])));
    }
}
