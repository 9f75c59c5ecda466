// client-go-e2e drives battery-apiserver with a client nobody in this repository wrote:
// client-go's dynamic client and its WebSocket exec executor, as a Go controller or
// kubectl would. It claims a MicroVM, watches the claim, runs `sh -c 'echo hi; exit 3'`
// in it through the claim's `exec` subresource, deletes the claim, and prints what it saw
// as one JSON line on stdout. It exits 0 when every step ran (the Rust test,
// e2e/tests/client_go.rs, judges the values) and non-zero, saying why on stderr, when one
// could not run. Every wait is bounded by --timeout.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
)

var groupVersion = schema.GroupVersion{Group: "battery.liquidmetal-x.dev", Version: "v1alpha1"}
var claims = groupVersion.WithResource("microvmclaims")

// The command the claim's MicroVM runs: output, then a non-zero exit code.
var command = []string{"sh", "-c", "echo hi; exit 3"}

// result is the JSON line printed on stdout.
type result struct {
	Name string `json:"name"`
	// The create response's status.phase.
	Created string `json:"created"`
	Stdout  string `json:"stdout"`
	Stderr  string `json:"stderr"`
	// The command's exit code, from the executor's error (0 when it returned none).
	ExitCode int `json:"exitCode"`
	// The event types of the watch opened before the create, from the list's
	// resourceVersion: the create (ADDED) through the delete (DELETED).
	Events []string `json:"events"`
	// The event types of the watch opened from the create's resourceVersion: only what
	// came after the create, so no ADDED.
	EventsFromCreate []string `json:"eventsFromCreate"`
}

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "the kubeconfig to use (default $KUBECONFIG)")
	namespace := flag.String("namespace", "default", "the namespace of the claim")
	pool := flag.String("pool", "dev", "the Pool to claim a MicroVM of")
	holder := flag.String("holder", "dev", "the claim's Holder: a ServiceAccount of the namespace")
	timeout := flag.Duration("timeout", 60*time.Second, "how long all the steps may take")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	out, err := run(ctx, *kubeconfig, *namespace, *pool, *holder)
	if err != nil {
		fmt.Fprintf(os.Stderr, "client-go-e2e: %v\n", err)
		os.Exit(1)
	}
	line, err := json.Marshal(out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "client-go-e2e: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(string(line))
}

func run(ctx context.Context, kubeconfig, namespace, pool, holder string) (*result, error) {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load the kubeconfig %q: %w", kubeconfig, err)
	}
	client, err := dynamic.NewForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("make the dynamic client: %w", err)
	}
	api := client.Resource(claims).Namespace(namespace)

	// The name is chosen here, as generateName would on the server, so that the first
	// watch can select it before the claim exists.
	out := &result{Name: "client-go-" + utilrand.String(5)}
	byName := fields.OneTermEqualSelector("metadata.name", out.Name).String()

	// As an informer does: list, then watch from the list's resourceVersion.
	list, err := api.List(ctx, metav1.ListOptions{FieldSelector: byName})
	if err != nil {
		return nil, fmt.Errorf("list microvmclaims: %w", err)
	}
	if len(list.Items) != 0 {
		return nil, fmt.Errorf("list microvmclaims named %s: %d already", out.Name, len(list.Items))
	}
	before, err := startWatch(ctx, api, "watch from the list", byName, list.GetResourceVersion())
	if err != nil {
		return nil, err
	}
	defer before.stop()

	claim := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": groupVersion.String(),
		"kind":       "MicroVMClaim",
		"metadata":   map[string]any{"name": out.Name, "namespace": namespace},
		"spec": map[string]any{
			"poolRef":            map[string]any{"name": pool},
			"serviceAccountName": holder,
		},
	}}
	created, err := api.Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create the claim %s: %w", out.Name, err)
	}
	// From here on the claim exists: delete it whatever happens, with a context of its
	// own, in case ctx is what failed.
	deleted := false
	defer func() {
		if deleted {
			return
		}
		cleanup, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := api.Delete(cleanup, out.Name, metav1.DeleteOptions{}); err != nil {
			fmt.Fprintf(os.Stderr, "client-go-e2e: delete the claim %s after a failure: %v\n", out.Name, err)
		}
	}()
	out.Created, _, _ = unstructured.NestedString(created.Object, "status", "phase")
	fmt.Fprintf(os.Stderr, "created %s/%s: phase %q, resourceVersion %s\n",
		namespace, out.Name, out.Created, created.GetResourceVersion())

	after, err := startWatch(ctx, api, "watch from the create", byName, created.GetResourceVersion())
	if err != nil {
		return nil, err
	}
	defer after.stop()

	if out.Stdout, out.Stderr, out.ExitCode, err = execute(ctx, config, namespace, out.Name); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "exec %q: exit code %d, stdout %q, stderr %q\n",
		command, out.ExitCode, out.Stdout, out.Stderr)

	if err := api.Delete(ctx, out.Name, metav1.DeleteOptions{}); err != nil {
		return nil, fmt.Errorf("delete the claim %s: %w", out.Name, err)
	}
	deleted = true
	if out.Events, err = before.untilDeleted(ctx); err != nil {
		return nil, err
	}
	if out.EventsFromCreate, err = after.untilDeleted(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// A watch whose events are collected as they come.
type watcher struct {
	name  string
	watch watch.Interface
	// Each event's type, in order; closed when the watch ends or DELETED was seen.
	types chan string
	// Set by stop: client-go's StreamWatcher may still hand out an ERROR event ("unable
	// to decode an event from the watch stream: http2: response body closed") after its
	// Stop, which is ours, not the server's.
	stopped atomic.Bool
}

func startWatch(ctx context.Context, api dynamic.ResourceInterface, name, selector, resourceVersion string) (*watcher, error) {
	// The server ends the watch too, should this program be stuck.
	seconds := int64(120)
	w, err := api.Watch(ctx, metav1.ListOptions{
		FieldSelector:   selector,
		ResourceVersion: resourceVersion,
		TimeoutSeconds:  &seconds,
	})
	if err != nil {
		return nil, fmt.Errorf("%s (resourceVersion %s): %w", name, resourceVersion, err)
	}
	watcher := &watcher{name: name, watch: w, types: make(chan string, 64)}
	go func() {
		defer close(watcher.types)
		for event := range w.ResultChan() {
			if watcher.stopped.Load() {
				return
			}
			detail := ""
			switch object := event.Object.(type) {
			case *unstructured.Unstructured:
				phase, _, _ := unstructured.NestedString(object.Object, "status", "phase")
				detail = fmt.Sprintf("%s phase %q resourceVersion %s", object.GetName(), phase, object.GetResourceVersion())
			case *metav1.Status:
				detail = fmt.Sprintf("%s: %s", object.Reason, object.Message)
			default:
				detail = fmt.Sprintf("%T", event.Object)
			}
			fmt.Fprintf(os.Stderr, "%s (resourceVersion %s): %s %s\n", name, resourceVersion, event.Type, detail)
			watcher.types <- string(event.Type)
			if event.Type == watch.Deleted || event.Type == watch.Error {
				return
			}
		}
	}()
	return watcher, nil
}

// untilDeleted returns the types of the events seen, once DELETED is among them.
func (w *watcher) untilDeleted(ctx context.Context) ([]string, error) {
	types := []string{}
	for {
		select {
		case t, open := <-w.types:
			if !open {
				return types, fmt.Errorf("%s ended after %v, before DELETED", w.name, types)
			}
			types = append(types, t)
			if t == string(watch.Deleted) {
				return types, nil
			}
		case <-ctx.Done():
			return types, fmt.Errorf("%s: no DELETED after %v: %w", w.name, types, ctx.Err())
		}
	}
}

func (w *watcher) stop() {
	w.stopped.Store(true)
	w.watch.Stop()
}

// execute runs `command` in the claim's MicroVM through its exec subresource with
// client-go's WebSocket executor (v5.channel.k8s.io), as kubectl exec does, and returns
// its stdout, stderr and exit code.
func execute(ctx context.Context, config *rest.Config, namespace, name string) (string, string, int, error) {
	server, apiPath, err := rest.DefaultServerURL(config.Host, "/apis", groupVersion, true)
	if err != nil {
		return "", "", 0, fmt.Errorf("the server's URL: %w", err)
	}
	target := server.JoinPath(apiPath, "namespaces", namespace, "microvmclaims", name, "exec")
	query := target.Query()
	for _, word := range command {
		query.Add("command", word)
	}
	query.Set("stdout", "true")
	query.Set("stderr", "true")
	target.RawQuery = query.Encode()

	// The WebSocket handshake is a GET, as kubectl's executor sends it.
	executor, err := remotecommand.NewWebSocketExecutor(config, "GET", target.String())
	if err != nil {
		return "", "", 0, fmt.Errorf("make the WebSocket executor: %w", err)
	}
	var stdout, stderr bytes.Buffer
	err = executor.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	var exit utilexec.ExitError
	switch {
	case err == nil:
		return stdout.String(), stderr.String(), 0, nil
	case errors.As(err, &exit):
		return stdout.String(), stderr.String(), exit.ExitStatus(), nil
	default:
		return stdout.String(), stderr.String(), 0, fmt.Errorf("exec %q in %s (stdout %q, stderr %q): %w",
			command, name, stdout.String(), stderr.String(), err)
	}
}
