//! The named presets: a profile for each kind of segment midway is put on, chosen from the
//! lab's measurements (README's presets table says what each is for).

#[cfg(test)]
use midway_config::AutoBuffer;
use midway_config::{BufferSize, Keepalive, ProfileSpec};

pub(crate) const PRESET_NAMES: [&str; 6] = [
    "cellular-local",
    "default",
    "hfc-local",
    "lan",
    "satellite-local",
    "wan",
];

/// Names of the shipped presets.
pub fn preset_names() -> &'static [&'static str] {
    &PRESET_NAMES
}

/// The cable modem of the hfc papers: 10 KB buffer, 25 Mbit/s downstream into 10 Mbit/s Ethernet,
/// one connection per modem, 1460-byte packets.
#[cfg(test)]
pub(crate) const HFC_MODEM: AutoBuffer = AutoBuffer {
    device_buffer_bytes: 10 * 1024,
    rate_in_bps: 25e6,
    rate_out_bps: 10e6,
    connections_per_device: 1,
    mss: 1460,
};

/// Spec of a preset, or `None` for an unknown name.
pub(crate) fn preset_spec(name: &str) -> Option<ProfileSpec> {
    match name {
        // `cellular-local`: the local segment over a narrow cellular bearer (a few hundred
        // kbit/s, a queue of a few dozen packets in front of the subscriber), where a browser
        // opens six connections per origin host name, through a proxy too (Chromium: 14 for one
        // page over three names). Measured with scenarios/narrow-cellular.toml (384/64 kbit/s,
        // 30 KB queue, 2 % Internet loss, Chromium, 10 runs a case;
        // docs/results/narrow-cellular/README.md):
        // - initial_cwnd = 1: Linux never paces a connection's first 10 segments, so a dozen
        //   connections with a window of 10 put 120 packets into a 20-packet queue at once; a
        //   window of 1 spreads each start over four round trips. Through the HTTP proxy (with
        //   the access link declared) the page loaded in 4.78 s (median; runs 4.51-5.13)
        //   against 6.00 s (4.05-7.13) with a window of 2 and 7.94 s with the kernel's 10;
        //   direct took 7.50 s;
        // - congestion_control = bbr (the kernel's default, made explicit): CUBIC took 4.82 s
        //   (4.78-5.10), inside BBR's spread.
        // On a bearer whose queue never drops (the umts reproduction's RNC) the window of 1
        // only slows each start: use it where the access queue is small.
        // `[[access_links]]` adds pacing at the bearer's rate across the subscriber's
        // connections; in that scenario it changed little beside this preset. With the
        // link's queue declared as well (`queue_bytes`), the subscriber's connections share
        // one window, which bounds the starts: there the kernel's window of 10 did as well
        // as this preset (commit 8992155, transparent: 0.52x of direct, 0.54x with the
        // preset, each against its own experiment's direct).
        // The preset stays for links whose queue is not known.
        "cellular-local" => Some(ProfileSpec {
            congestion_control: Some("bbr".to_owned()),
            initial_cwnd: Some(1),
            ..ProfileSpec::default()
        }),
        // `default`: the kernel as it is. The baseline every lab comparison starts from.
        "default" => Some(ProfileSpec::default()),
        // `hfc-local`: the local segment (proxy -> cable modem -> PC, 20 ms RTT) as tuned in
        // hfc-tuning and used by the tuned proxy of hfc-proxy:
        // - delayed_ack = false: the proxy ACKs what it receives at once (hfc-proxy fig. 7: no
        //   delayed ACK at the proxy as receiver, up to +30 % for short transfers; hfc-tuning
        //   fig. 13: half the ACKs makes a connection fragile under upstream ACK loss);
        // - dupack_threshold = 1: "super fast retransmit" on the first duplicate ACK, valid
        //   because the access network delivers in order (hfc-tuning figs. 16-18, hfc-proxy
        //   fig. 9);
        // - rto_min_ms = 40: the papers halve the timer (500 -> 200 ms, hfc-tuning fig. 15,
        //   ~2x at 3 % loss); Linux already starts at 200 ms, so take the same step relative
        //   to the 20 ms local RTT: two RTTs;
        // - initial_cwnd = 10: at least the paper's 2 (figs. 11-12: a 1-segment start waits up
        //   to 200 ms for the PC's delayed ACK), and Linux's 10 made explicit because it still
        //   fits the modem: 10 back-to-back segments queue 0.6 x 9 = 5.4 < 7 packets;
        // - congestion_control = bbr: random loss on the cable is not congestion; a loss-based
        //   sender (Reno, CUBIC) halves its window at every drop, BBR keeps its paced rate.
        //   Measured with scenarios/hfc-demo.toml (README): with the buffer rule and the
        //   kernel's loss-based behaviour the local segment was window-bound at ~9 Mbit/s;
        // - buffers are left to the kernel's autotuning. The hfc-tuning rule (figs. 8-10) bounds
        //   the window of a *loss-based* sender so it cannot overrun the modem's 10 KB queue;
        //   BBR's pacing already keeps that queue short, and a fixed 18 KB send buffer caps the
        //   segment at 18 KB per 20 ms RTT (~7 Mbit/s) on a 25 Mbit/s link. Operators who run a
        //   loss-based control on the access segment set `send_buffer = { auto = { ... } }` with
        //   their modem's figures (HFC_MODEM holds the paper's);
        // - nodelay: the relay writes whole chunks, Nagle would only add delay.
        // - max_pacing_rate_bps is left unset: it depends on the access link's rate, which a
        //   preset cannot know. scenarios/hfc-pacing.toml (10 MB, modern hosts, 25 Mbit/s into
        //   the 10 KB modem queue) measured a ceiling 9-17 % above the link's payload rate
        //   (26-28 Mbit/s) removing a third to two thirds of the queue drops of BBR's probing,
        //   +1-2 % over hand-tuned HAProxy at 0-3 % loss and even at 10 %; a ceiling at or below
        //   the payload rate (23-24 Mbit/s) removes them all but costs 4-7 % at 10 % loss (no
        //   standing queue is left to keep the link busy while the sender recovers).
        "hfc-local" => Some(ProfileSpec {
            congestion_control: Some("bbr".to_owned()),
            delayed_ack: Some(false),
            dupack_threshold: Some(1),
            rto_min_ms: Some(40),
            initial_cwnd: Some(10),
            nodelay: Some(true),
            ..ProfileSpec::default()
        }),
        // `lan`: a segment over a short, clean link inside the operator's own network: the
        // gateway's side towards a data centre, a chain of proxies in one rack, the bench's
        // veth pairs. Measured on the 2-core bench at 100 streams, end hosts on BBR
        // (docs/results/bench/README.md, "The TCP settings of midway's sockets", 2026-11-21):
        // - congestion_control = cubic: such a link has no random loss for BBR to ride out,
        //   and BBR needs pacing, which the kernel then does per socket with a timer of its
        //   own unless the interface's qdisc is `fq`. Most interfaces run pfifo_fast, virtual
        //   ones none. CUBIC alone took midway from 0.60 to 0.65 of direct and from 0.50 to
        //   0.38 proxy CPU-s/GB (five alternated rounds each);
        // - delayed_ack = false: ACK every segment at once, as the papers' tuned proxy does.
        //   A paced sender (BBR) on the other side sizes its bursts and its rate from the ACK
        //   clock; ACKs held back for the delayed-ACK timer made it send smaller bursts at a
        //   lower rate. With quick ACKs added, midway went from ~17 to ~28 Gbit/s with less
        //   CPU per GB than `direct`, whose receivers delay their ACKs. On a short link the
        //   extra ACKs cost little;
        // - buffers are left to autotuning (the round trip is short, autotuning finds it);
        // - nodelay: the relay writes whole chunks, Nagle would only add delay.
        "lan" => Some(ProfileSpec {
            congestion_control: Some("cubic".to_owned()),
            delayed_ack: Some(false),
            nodelay: Some(true),
            ..ProfileSpec::default()
        }),
        // `satellite-local`: the GEO hop (about 550 ms RTT). The satellite paper's PEP starts
        // with a 64 KB window over the satellite: 45 segments of 1448 B, so a 65 KB page goes
        // out in the first round trip instead of after several half-second ones. BBR because
        // loss on the radio link is not congestion. 4 MiB buffers hold 24 Mbit/s (the forward
        // link) x 0.6 s twice over and stay within Linux's default `*mem_max`, so no
        // privilege is needed for them. A not-sent low-water mark keeps the relay from parking
        // megabytes of unsent data in the socket.
        "satellite-local" => Some(ProfileSpec {
            congestion_control: Some("bbr".to_owned()),
            initial_cwnd: Some(45),
            send_buffer: Some(BufferSize::Bytes(4 * 1024 * 1024)),
            recv_buffer: Some(BufferSize::Bytes(4 * 1024 * 1024)),
            notsent_lowat: Some(256 * 1024),
            nodelay: Some(true),
            ..ProfileSpec::default()
        }),
        // `wan`: the remote segment (proxy -> server) on a long fat path. The overlay paper's
        // proxies fill a 150 KB BDP only with large socket buffers, and hfc-proxy fig. 13 gets
        // ~4x from 8 KB -> 32 KB on the remote side: 4 MiB (320 Mbit/s at 100 ms) so the
        // window, not the buffer, limits. BBR keeps the rate under random loss. Keepalive so
        // that warm upstream connections (the umts paper's pools) notice dead servers.
        // connect_backup_ms = 250: a browser going direct hides a lost SYN (it binds each
        // request to whichever of its connections is ready first, and Chromium starts a backup
        // connect after 250 ms); behind a split connection the request waits on midway's one
        // upstream connect, and a lost SYN or SYN-ACK cost the kernel's one-second initial
        // timeout. scenarios/browser-links.toml (0.5 % Internet loss, Chromium) had 8 of 40
        // runs through midway a second slower than any direct run, each with a proxy-side
        // timeout, and none after this (docs/results/browser-links). 250 ms is Chromium's
        // interval.
        "wan" => Some(ProfileSpec {
            congestion_control: Some("bbr".to_owned()),
            send_buffer: Some(BufferSize::Bytes(4 * 1024 * 1024)),
            recv_buffer: Some(BufferSize::Bytes(4 * 1024 * 1024)),
            keepalive: Some(Keepalive {
                idle_s: 60,
                interval_s: 10,
                count: 6,
            }),
            connect_backup_ms: Some(250),
            ..ProfileSpec::default()
        }),
        _ => None,
    }
}
