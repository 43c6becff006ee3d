// Package cni networks the oci backend's containers with CNI plugins through libcni.
//
// The flow, for one container:
//
//  1. [New] loads the network: the operator's .conflist in [Config.ConfDir] whose "name" is
//     [Config.NetworkName], or, when there is none, the generated default chain (bridge with
//     host-local IPAM on a private subnet, then portmap; see [DefaultConfList]). It refuses,
//     naming what is missing, when a plugin of the chain is not in [Config.BinDirs].
//  2. The oci backend pins a network namespace for the container with [NewNetns] (so it
//     outlives the container's processes), names it in the OCI spec and calls
//     [Network.Attach] with it, the container ports and the work's properties. Attach brings
//     up "lo" with the loopback plugin, then runs the chain's ADD with
//     runtimeConfig.portMappings (one host port per container port, from the caller or from
//     its [PortAllocator]) and the properties, and returns the container's address and its
//     host port mappings: what the rep reports as instance_address and ports.
//  3. [Network.Detach] runs the chain's DEL with the configuration and arguments libcni
//     cached at ADD time, which removes the veth, the IPAM allocation and the iptables rules;
//     then the backend removes the namespace with [RemoveNetns]. Detach before the namespace
//     goes: bridge removes its masquerade rules only when it can read the address there.
//
// A restarted rep gets a running container's address and host ports back from libcni's cache
// with [Network.Attached].
//
// Properties reach every plugin two ways, so a plugin written against CNI needs no Gavel
// code:
//
//   - runtimeConfig: libcni injects the capability argument [PropertiesCapability]
//     ("io.gavel.properties"), a JSON object holding every property byte for byte, into the
//     config of each plugin that declares "capabilities": {"io.gavel.properties": true}.
//     This is the complete form.
//   - CNI_ARGS: "IgnoreUnknown=1;key=value;..." (keys sorted). CNI_ARGS has no escaping, so
//     a property whose key or value holds ';', '=' or NUL, whose key is empty or one the
//     reference plugins interpret (IP, MAC, ...; see [CNIArgs]), or that would make CNI_ARGS
//     longer than [MaxCNIArgs] is left out of CNI_ARGS (and listed in
//     [Attachment.SkippedArgs]); runtimeConfig still carries it.
//
// An Attach that fails runs DEL for what it started, so a failed container leaves no veth,
// address or iptables rule behind, and its error names the plugin that failed.
package cni
