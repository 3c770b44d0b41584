//! Links: list them, find one by name, bring one up or down, set its MTU, delete it, and
//! create a veth pair whose ends may go straight into other network namespaces.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo as NlLinkInfo, LinkMessage,
};
use netlink_packet_route::RouteNetlinkMessage;

use super::{Netlink, NetlinkError};

/// What `ip link show` says about one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    /// Interface index.
    pub index: u32,
    /// Name.
    pub name: String,
    /// Administratively up.
    pub up: bool,
    /// MTU.
    pub mtu: Option<u32>,
    /// Link-layer address (a MAC for Ethernet and veth).
    pub address: Option<Vec<u8>>,
}

impl LinkInfo {
    /// The link-layer address as `ip` writes it (`aa:bb:cc:dd:ee:ff`).
    pub fn address_text(&self) -> Option<String> {
        self.address.as_ref().map(|bytes| {
            bytes
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        })
    }
}

/// One end of a veth pair for [`Netlink::add_veth`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VethEnd {
    /// Interface name.
    pub name: String,
    /// MTU (`None`: the kernel's default, 1500).
    pub mtu: Option<u32>,
    /// The network namespace (handle path) it is created in; `None`: the socket's own.
    pub namespace: Option<PathBuf>,
}

impl VethEnd {
    /// An end named `name` in the socket's namespace, default MTU.
    pub fn named(name: impl Into<String>) -> VethEnd {
        VethEnd {
            name: name.into(),
            mtu: None,
            namespace: None,
        }
    }

    /// This end in the namespace named `name` (in `/run/netns`).
    pub fn in_named_namespace(mut self, name: &str) -> VethEnd {
        self.namespace = Some(crate::netns::netns_path(name));
        self
    }

    /// This end with MTU `mtu`.
    pub fn with_mtu(mut self, mtu: u32) -> VethEnd {
        self.mtu = Some(mtu);
        self
    }

    /// The attributes naming the end, its MTU and its namespace (whose handle must stay open
    /// until the kernel has answered).
    fn attributes(&self) -> Result<(Vec<LinkAttribute>, Option<File>), NetlinkError> {
        let mut attributes = vec![LinkAttribute::IfName(self.name.clone())];
        if let Some(mtu) = self.mtu {
            attributes.push(LinkAttribute::Mtu(mtu));
        }
        let handle = match &self.namespace {
            None => None,
            Some(path) => {
                let file = File::open(path).map_err(|source| NetlinkError::Namespace {
                    path: path.clone(),
                    source,
                })?;
                attributes.push(LinkAttribute::NetNsFd(file.as_raw_fd()));
                Some(file)
            }
        };
        Ok((attributes, handle))
    }

    fn describe(&self) -> String {
        let mut text = self.name.clone();
        if let Some(mtu) = self.mtu {
            text.push_str(&format!(" mtu {mtu}"));
        }
        if let Some(path) = &self.namespace {
            text.push_str(&format!(" netns {}", path.display()));
        }
        text
    }
}

fn link_message(index: u32) -> LinkMessage {
    let mut message = LinkMessage::default();
    message.header.index = index;
    message
}

impl Netlink {
    /// Every interface of the socket's namespace (`ip link show`).
    pub fn links(&mut self) -> Result<Vec<LinkInfo>, NetlinkError> {
        let messages = self.dump(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            "link show",
        )?;
        Ok(messages
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(link) => Some(link_info(link)),
                _ => None,
            })
            .collect())
    }

    /// The interface named `name`.
    pub fn link(&mut self, name: &str) -> Result<LinkInfo, NetlinkError> {
        self.links()?
            .into_iter()
            .find(|l| l.name == name)
            .ok_or_else(|| NetlinkError::NoSuchLink(name.to_owned()))
    }

    /// The index of the interface named `name` (for [`super::Route::device`]).
    pub fn link_index(&mut self, name: &str) -> Result<u32, NetlinkError> {
        self.link(name).map(|l| l.index)
    }

    /// `ip link set NAME up`.
    pub fn set_link_up(&mut self, name: &str) -> Result<(), NetlinkError> {
        self.set_link_flags(name, true)
    }

    /// `ip link set NAME down`.
    pub fn set_link_down(&mut self, name: &str) -> Result<(), NetlinkError> {
        self.set_link_flags(name, false)
    }

    fn set_link_flags(&mut self, name: &str, up: bool) -> Result<(), NetlinkError> {
        let index = self.link_index(name)?;
        let mut message = link_message(index);
        if up {
            message.header.flags = LinkFlags::Up;
        }
        message.header.change_mask = LinkFlags::Up;
        let request = format!("link set {name} {}", if up { "up" } else { "down" });
        self.request(RouteNetlinkMessage::SetLink(message), 0, &request)
    }

    /// `ip link set NAME mtu MTU`.
    pub fn set_link_mtu(&mut self, name: &str, mtu: u32) -> Result<(), NetlinkError> {
        let index = self.link_index(name)?;
        let mut message = link_message(index);
        message.attributes.push(LinkAttribute::Mtu(mtu));
        let request = format!("link set {name} mtu {mtu}");
        self.request(RouteNetlinkMessage::SetLink(message), 0, &request)
    }

    /// `ip link del NAME` (for a veth, the peer goes too).
    pub fn delete_link(&mut self, name: &str) -> Result<(), NetlinkError> {
        let index = self.link_index(name)?;
        let request = format!("link del {name}");
        self.request(
            RouteNetlinkMessage::DelLink(link_message(index)),
            0,
            &request,
        )
    }

    /// `ip link add A [mtu M] [netns NS] type veth peer name B [mtu M] [netns NS]`: a veth pair,
    /// each end created directly in its namespace (so no name ever appears in the socket's
    /// own namespace when both are elsewhere). Both ends start down.
    pub fn add_veth(&mut self, end: &VethEnd, peer: &VethEnd) -> Result<(), NetlinkError> {
        let (mut attributes, _end_namespace) = end.attributes()?;
        let (peer_attributes, _peer_namespace) = peer.attributes()?;
        let mut peer_message = LinkMessage::default();
        peer_message.attributes = peer_attributes;
        attributes.push(LinkAttribute::LinkInfo(vec![
            NlLinkInfo::Kind(InfoKind::Veth),
            NlLinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_message))),
        ]));
        let mut message = LinkMessage::default();
        message.attributes = attributes;
        let request = format!(
            "link add {} type veth peer name {}",
            end.describe(),
            peer.describe()
        );
        self.request(
            RouteNetlinkMessage::NewLink(message),
            NLM_F_CREATE | NLM_F_EXCL,
            &request,
        )
    }
}

fn link_info(message: &LinkMessage) -> LinkInfo {
    let mut info = LinkInfo {
        index: message.header.index,
        name: String::new(),
        up: message.header.flags.contains(LinkFlags::Up),
        mtu: None,
        address: None,
    };
    for attribute in &message.attributes {
        match attribute {
            LinkAttribute::IfName(name) => info.name = name.clone(),
            LinkAttribute::Mtu(mtu) => info.mtu = Some(*mtu),
            LinkAttribute::Address(address) => info.address = Some(address.clone()),
            _ => {}
        }
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_addresses_read_as_ip_writes_them() {
        let info = LinkInfo {
            index: 2,
            name: "va".into(),
            up: true,
            mtu: Some(1500),
            address: Some(vec![0x02, 0xab, 0, 1, 0x10, 0xff]),
        };
        assert_eq!(info.address_text().as_deref(), Some("02:ab:00:01:10:ff"));
    }

    #[test]
    fn veth_ends_describe_themselves() {
        let end = VethEnd::named("a0")
            .with_mtu(1500)
            .in_named_namespace("lab-a");
        assert_eq!(end.describe(), "a0 mtu 1500 netns /run/netns/lab-a");
        assert!(matches!(
            end.attributes(),
            Err(NetlinkError::Namespace { .. })
        ));
        let (attributes, handle) = VethEnd::named("b0").attributes().unwrap();
        assert_eq!(attributes, vec![LinkAttribute::IfName("b0".into())]);
        assert!(handle.is_none());
    }
}
