//! Interface addresses (`ip addr add`, `ip addr show`).

use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressScope,
};
use netlink_packet_route::RouteNetlinkMessage;

use super::{Family, Netlink, NetlinkError};

/// An address on an interface: `ADDRESS/PREFIX dev DEVICE [nodad]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressSpec {
    /// The address and the prefix length of its subnet (`10.0.1.1/24`).
    pub address: IpNet,
    /// Interface index.
    pub device: u32,
    /// IPv6: usable at once, without duplicate address detection (`nodad`).
    pub nodad: bool,
}

impl AddressSpec {
    fn message(&self) -> AddressMessage {
        let address = self.address.addr();
        let mut message = AddressMessage::default();
        message.header.family = Family::of(address).netlink();
        message.header.prefix_len = self.address.prefix_len();
        message.header.index = self.device;
        message.header.scope = default_scope(address);
        // Local and peer address are the same on a broadcast link, as `ip addr add` sends them.
        message.attributes.push(AddressAttribute::Local(address));
        message.attributes.push(AddressAttribute::Address(address));
        if self.nodad {
            message.header.flags = AddressHeaderFlags::Nodad;
            message
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        message
    }
}

/// The scope `ip addr add` gives an address: host for loopback, link for IPv6 link-local,
/// global otherwise.
fn default_scope(address: IpAddr) -> AddressScope {
    match address {
        IpAddr::V4(a) if a.is_loopback() => AddressScope::Host,
        IpAddr::V6(a) if a.is_loopback() => AddressScope::Host,
        IpAddr::V6(a) if (a.segments()[0] & 0xffc0) == 0xfe80 => AddressScope::Link,
        _ => AddressScope::Universe,
    }
}

impl Netlink {
    /// `ip addr add ADDRESS/PREFIX dev DEVICE [nodad]`; `EEXIST` if it is there already.
    pub fn add_address(&mut self, spec: &AddressSpec) -> Result<(), NetlinkError> {
        let request = format!(
            "addr add {} dev #{}{}",
            spec.address,
            spec.device,
            if spec.nodad { " nodad" } else { "" }
        );
        self.request(
            RouteNetlinkMessage::NewAddress(spec.message()),
            NLM_F_CREATE | NLM_F_EXCL,
            &request,
        )
    }

    /// The addresses of interface `device` (by index), with their prefix lengths.
    pub fn addresses(&mut self, device: u32) -> Result<Vec<IpNet>, NetlinkError> {
        let messages = self.dump(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            "addr show",
        )?;
        Ok(messages
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) if a.header.index == device => Some(a),
                _ => None,
            })
            .filter_map(|a| {
                let address = a.attributes.iter().find_map(|attribute| match attribute {
                    AddressAttribute::Address(address) => Some(*address),
                    _ => None,
                })?;
                IpNet::new(address, a.header.prefix_len).ok()
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_message_is_what_ip_addr_add_sends() {
        let spec = AddressSpec {
            address: "fd00:231::1/64".parse().unwrap(),
            device: 4,
            nodad: true,
        };
        let message = spec.message();
        assert_eq!(message.header.prefix_len, 64);
        assert_eq!(message.header.index, 4);
        assert_eq!(message.header.flags, AddressHeaderFlags::Nodad);
        assert_eq!(message.header.scope, AddressScope::Universe);
        assert_eq!(
            default_scope("fe80::1".parse().unwrap()),
            AddressScope::Link
        );
        assert_eq!(
            default_scope("127.0.0.1".parse().unwrap()),
            AddressScope::Host
        );
    }
}
