//! Static neighbour entries (`ip neigh replace ADDR lladdr MAC dev IF nud permanent`).

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::neighbour::{NeighbourAttribute, NeighbourMessage, NeighbourState};
use netlink_packet_route::RouteNetlinkMessage;

use super::{Family, Netlink, NetlinkError};

/// A neighbour entry the kernel never ages out nor re-resolves (`nud permanent`): traffic to
/// `address` on `device` goes to `link_address` from the first packet, without ARP or neighbour
/// discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermanentNeighbour {
    /// The neighbour's IP address.
    pub address: IpAddr,
    /// Its link-layer (MAC) address, as [`super::LinkInfo::address`] gives it.
    pub link_address: Vec<u8>,
    /// The interface it is reached on, by index ([`Netlink::link_index`]).
    pub device: u32,
}

impl PermanentNeighbour {
    /// The message `ip neigh replace` sends: family of the address, the interface, state
    /// permanent, then destination and link-layer address.
    fn message(&self) -> NeighbourMessage {
        let mut message = NeighbourMessage::default();
        message.header.family = Family::of(self.address).netlink();
        message.header.ifindex = self.device;
        message.header.state = NeighbourState::Permanent;
        message
            .attributes
            .push(NeighbourAttribute::Destination(self.address.into()));
        message
            .attributes
            .push(NeighbourAttribute::LinkLayerAddress(
                self.link_address.clone(),
            ));
        message
    }

    fn describe(&self) -> String {
        let mac: Vec<String> = self
            .link_address
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!(
            "neigh replace {} lladdr {} dev #{} nud permanent",
            self.address,
            mac.join(":"),
            self.device
        )
    }
}

impl Netlink {
    /// `ip neigh replace ADDR lladdr MAC dev IF nud permanent`: adds the entry, or replaces
    /// whatever the kernel had learned for that address on that interface.
    pub fn replace_neighbour(
        &mut self,
        neighbour: &PermanentNeighbour,
    ) -> Result<(), NetlinkError> {
        self.request(
            RouteNetlinkMessage::NewNeighbour(neighbour.message()),
            NLM_F_CREATE | NLM_F_REPLACE,
            &neighbour.describe(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::AddressFamily;

    #[test]
    fn a_permanent_neighbour_is_what_ip_neigh_replace_sends() {
        let neighbour = PermanentNeighbour {
            address: "10.0.1.2".parse().unwrap(),
            link_address: vec![0x02, 0xab, 0, 1, 0x10, 0xff],
            device: 7,
        };
        let message = neighbour.message();
        assert_eq!(message.header.family, AddressFamily::Inet);
        assert_eq!(message.header.ifindex, 7);
        assert_eq!(message.header.state, NeighbourState::Permanent);
        assert_eq!(message.attributes.len(), 2);
        assert_eq!(
            neighbour.describe(),
            "neigh replace 10.0.1.2 lladdr 02:ab:00:01:10:ff dev #7 nud permanent"
        );
    }
}
