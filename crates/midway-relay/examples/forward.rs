// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A minimal TCP forwarder around `midway_relay::relay`, for manual measurements on loopback
//! or inside lab namespaces (the real proxy lives in midway-proxy).
//!
//! `cargo run --release -p midway-relay --example forward -- LISTEN TARGET MODEL [BUFFER_BYTES]`
//! MODEL: `splice`, `copy` or `spool`. Prints one line per finished connection.

use std::net::SocketAddr;
use std::sync::Arc;

use midway_relay::{relay, BufferConfig, RelayModel, RelayOptions, RelayResources, SpoolConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
enum ForwardError {
    #[error("usage: forward LISTEN_ADDR TARGET_ADDR splice|copy|spool [BUFFER_BYTES]")]
    Usage,
    #[error("bad address")]
    Address(#[from] std::net::AddrParseError),
    #[error("bad buffer size")]
    Number(#[from] std::num::ParseIntError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Relay(#[from] midway_relay::RelayError),
}

#[tokio::main]
async fn main() -> Result<(), ForwardError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, target, model, rest @ ..] = args.as_slice() else {
        return Err(ForwardError::Usage);
    };
    let listen: SocketAddr = listen.parse()?;
    let target: SocketAddr = target.parse()?;
    let buffer_bytes: usize = match rest.first() {
        Some(text) => text.parse()?,
        None => 1 << 20,
    };
    let model = match model.as_str() {
        "splice" | "copy" => RelayModel::Buffer(BufferConfig {
            buffer_bytes,
            splice: model == "splice",
        }),
        "spool" => RelayModel::Spool(SpoolConfig {
            memory_bytes: buffer_bytes,
            max_spool_bytes: 1 << 30,
            buffer_bytes,
        }),
        _ => return Err(ForwardError::Usage),
    };
    let spool_dir = std::env::temp_dir().join("midway-relay-forward");
    let resources = RelayResources::new(spool_dir, 4 << 30, 256)?;
    let listener = TcpListener::bind(listen).await?;
    let model = Arc::new(model);
    loop {
        let (client, peer) = listener.accept().await?;
        let (model, resources) = (Arc::clone(&model), Arc::clone(&resources));
        tokio::spawn(async move {
            let server = match TcpStream::connect(target).await {
                Ok(server) => server,
                Err(e) => return eprintln!("{peer}: connect {target}: {e}"),
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let result = relay(
                client,
                server,
                &model,
                &resources,
                RelayOptions::default(),
                CancellationToken::new(),
            )
            .await;
            match result {
                Ok(report) => println!("{peer}: {report:?}"),
                Err(e) => eprintln!("{peer}: {e}"),
            }
        });
    }
}
