package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
)

// ClusterConfig is a running cluster to measure: one of its gateways and
// one of its nodes (`cella bench cluster`), and its API for the resume
// figures (nil: those figures say why they are missing, KubeErr).
type ClusterConfig struct {
	GatewayURL, NodeURL, APIKey string
	// N is the rounds of each latency figure, Concurrent the creates of
	// each burst (default 20).
	N, Concurrent      int
	Kube               ctrlclient.Client
	Namespace, KubeErr string
}

// Cluster measures create → first exec done through a gateway beside the
// same directly on a node, alternating the two so both see the same load:
// the ratio is what the gateway's hop (authentication, placement, the
// forward of the create and of the exec's traffic) costs. Then a burst of
// concurrent creates each way: what the gateway and the nodes sustain
// when every create writes its records to the cluster's API at once (the
// gateway spreads its burst over the live nodes).
func Cluster(ctx context.Context, cc ClusterConfig) ([]Figure, error) {
	if cc.N <= 0 {
		cc.N = 20
	}
	if cc.Concurrent <= 0 {
		cc.Concurrent = 20
	}
	gw, err := client.New(client.Config{URL: cc.GatewayURL, APIKey: cc.APIKey})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	node, err := client.New(client.Config{URL: cc.NodeURL, APIKey: cc.APIKey})
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	var direct, via, directCreate, viaCreate []time.Duration
	var lastDirect, lastVia error
	for i := 0; i < cc.N; i++ {
		if total, create, err := createThenExec(ctx, node); err != nil {
			lastDirect = err
		} else {
			direct, directCreate = append(direct, total), append(directCreate, create)
		}
		if total, create, err := createThenExec(ctx, gw); err != nil {
			lastVia = err
		} else {
			via, viaCreate = append(via, total), append(viaCreate, create)
		}
	}
	figs := []Figure{
		summarize("create → first exec done, directly on a node", "", direct),
		summarize("create → first exec done, through the gateway", "", via),
		summarize("create call, directly on a node", "", directCreate),
		summarize("create call, through the gateway", "", viaCreate),
	}
	figs[1].against(figs[0])
	figs[3].against(figs[2])
	for i, err := range []error{lastDirect, lastVia, lastDirect, lastVia} {
		if err != nil && figs[i].N == 0 {
			figs[i].Err = err.Error()
		}
	}
	burstNode := burst(ctx, node, "", cc.Concurrent, client.CreateRequest{}, fmt.Sprintf("%d concurrent creates, directly on a node", cc.Concurrent))
	burstGateway := burst(ctx, gw, "", cc.Concurrent, client.CreateRequest{}, fmt.Sprintf("%d concurrent creates, through the gateway", cc.Concurrent))
	burstGateway.against(burstNode)
	figs = append(figs, burstNode, burstGateway)
	local, moved := clusterResume(ctx, cc, gw)
	figs = append(figs, local, moved)
	if len(direct) == 0 && len(via) == 0 {
		return figs, fmt.Errorf("no create succeeded: directly: %v; through the gateway: %v", lastDirect, lastVia)
	}
	return figs, nil
}
