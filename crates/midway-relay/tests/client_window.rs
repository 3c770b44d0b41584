// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A window shared with other connections (`RelayOptions::client_window`): both models write
//! toward the client no more than it grants, and carry everything once it opens. Fails if a
//! model writes past the window (more than the grant reaches the client), or if a full window
//! stops the direction for good (the transfer never completes).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use midway_relay::{ClientWindow, RelayModel};
use midway_testkit::data::*;
use midway_testkit::relay::*;
use midway_testkit::wait::*;
use tokio::sync::Notify;

const GRANTED_FIRST: u64 = 10_000;
const TRANSFER: u64 = 2 << 20;

/// A window of so many bytes, opened by the test.
struct TestWindow {
    left: Mutex<u64>,
    opened: Notify,
}

impl TestWindow {
    fn open(&self, bytes: u64) {
        *self.left.lock().unwrap() += bytes;
        self.opened.notify_waiters();
    }
}

impl ClientWindow for TestWindow {
    fn grant(&self, want: usize) -> usize {
        let mut left = self.left.lock().unwrap();
        let granted = (*left).min(want as u64);
        *left -= granted;
        granted as usize
    }

    fn give_back(&self, bytes: usize) {
        *self.left.lock().unwrap() += bytes as u64;
    }

    fn opened(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async {
            tokio::select! {
                () = self.opened.notified() => {}
                () = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        })
    }
}

async fn held_to_its_window(model: RelayModel) {
    let res = resources(1 << 30, 4);
    let window = Arc::new(TestWindow {
        left: Mutex::new(GRANTED_FIRST),
        opened: Notify::new(),
    });
    let relayed = relayed_windowed(model, &res.resources, window.clone()).await;
    let (mut client_read, _client_write) = relayed.client.into_split();
    let (_server_read, mut server_write) = relayed.server.into_split();
    let sender = tokio::spawn(async move { send_pattern(&mut server_write, TRANSFER, 5).await });
    wait_until_server_to_client_settles(&relayed.counters, 10).await;
    let delivered = relayed.counters.server_to_client.load(Ordering::Relaxed);
    assert_eq!(
        delivered, GRANTED_FIRST,
        "the relay wrote toward the client what the window granted, no more"
    );
    window.open(TRANSFER);
    let (received, sum) = within(TEST_TIMEOUT, receive_all(&mut client_read))
        .await
        .unwrap();
    assert_eq!(
        received, TRANSFER,
        "everything arrives once the window opens"
    );
    assert_eq!(sum, sender.await.unwrap().unwrap());
}

#[tokio::test]
async fn buffer_model_splicing_keeps_to_the_window() {
    held_to_its_window(buffer_model(64 * 1024, true)).await;
}

#[tokio::test]
async fn buffer_model_copying_keeps_to_the_window() {
    held_to_its_window(buffer_model(64 * 1024, false)).await;
}

#[tokio::test]
async fn spool_model_keeps_to_the_window() {
    held_to_its_window(spool_model(256 * 1024, 64 << 20)).await;
}
