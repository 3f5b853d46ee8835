//! A one-off command's terminal carried into its container (`rollgate run` of an image
//! release): what is typed reaches the container's stdin, and when rollgate's stdin is a
//! terminal the container gets a terminal of its own (`Tty`), the size of this one, with this
//! one in raw mode meanwhile — its line editing, echo and Ctrl-C are then the container's, as
//! with `docker run -it`. A process release needs none of this: it is handed the terminal.

use std::os::fd::AsFd;
use std::pin::Pin;

use tokio::io::{AsyncWrite, AsyncWriteExt};

/// This process's terminal in raw mode for as long as it lives, then as it was.
pub struct RawTerminal {
    saved: Option<nix::sys::termios::Termios>,
}

impl RawTerminal {
    /// Raw mode when stdin is a terminal; nothing otherwise.
    pub fn when_a_terminal() -> RawTerminal {
        let stdin = std::io::stdin();
        let saved = nix::sys::termios::tcgetattr(stdin.as_fd()).ok();
        if let Some(saved) = &saved {
            let mut raw = saved.clone();
            nix::sys::termios::cfmakeraw(&mut raw);
            let _ = nix::sys::termios::tcsetattr(
                stdin.as_fd(),
                nix::sys::termios::SetArg::TCSANOW,
                &raw,
            );
        }
        RawTerminal { saved }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin().as_fd(),
                nix::sys::termios::SetArg::TCSANOW,
                saved,
            );
        }
    }
}

/// Whether stdin is a terminal (the container then gets one).
pub fn stdin_is_a_terminal() -> bool {
    nix::unistd::isatty(0).unwrap_or(false)
}

/// The terminal's size on stdin (rows, columns), if it is one.
pub fn size() -> Option<(u16, u16)> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into the struct it is given, which lives here.
    let done = unsafe { libc::ioctl(0, libc::TIOCGWINSZ, &mut size) };
    (done == 0 && size.ws_row > 0).then_some((size.ws_row, size.ws_col))
}

/// Copies stdin into `input` until stdin ends, then closes `input` (the container's stdin
/// ends) — unless stdin is a terminal: the engine would then end the whole attachment, output
/// included, and a terminal's end of input (Ctrl-D) is a byte the container's own terminal
/// reads. Stdin is read on a thread of its own, never joined: a read waiting for a key must
/// not keep this process from exiting when the container has ended.
pub fn feed(mut input: Pin<Box<dyn AsyncWrite + Send>>) {
    let terminal = stdin_is_a_terminal();
    let (sender, mut received) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut stdin = std::io::stdin().lock();
        let mut buffer = vec![0u8; 8192];
        loop {
            match stdin.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sender.blocking_send(buffer[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    tokio::spawn(async move {
        while let Some(bytes) = received.recv().await {
            if input.write_all(&bytes).await.is_err() {
                return;
            }
            let _ = input.flush().await;
        }
        if terminal {
            // Kept open until the container ends (this process with it).
            std::future::pending::<()>().await;
        }
        let _ = input.shutdown().await;
    });
}
