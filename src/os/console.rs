//! The console, which may go away: a closed pipe (`tune | head`, `tune 2>&1 | head`, a pager quit
//! early) ends what is printed, never the run. `println!` and `eprintln!` would panic there and lose
//! the run's end.
use std::io::Write;

/// Write `text` to standard output; a closed or failing stdout is ignored (the log and the reports
/// hold everything the console shows).
pub fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
}

/// `println!` that a closed stdout cannot turn into a panic: see [`out`].
#[macro_export]
macro_rules! say {
    () => {
        $crate::os::console::out("\n")
    };
    ($($arg:tt)*) => {
        $crate::os::console::out(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// Write `text` to standard error; a closed or failing stderr is ignored, as for [`out`].
pub fn err(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes());
}

/// `eprintln!` that a closed stderr cannot turn into a panic: see [`err`].
#[macro_export]
macro_rules! tell {
    () => {
        $crate::os::console::err("\n")
    };
    ($($arg:tt)*) => {
        $crate::os::console::err(&format!("{}\n", format_args!($($arg)*)))
    };
}
