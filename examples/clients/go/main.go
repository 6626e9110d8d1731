// spoold's lease protocol and an idempotent forward, with net/http only.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
)

var (
	base = strings.TrimSuffix(getenv("SPOOLD_URL", "http://127.0.0.1:8787"), "/")
	key  = os.Getenv("SPOOLD_API_KEY")
)

func getenv(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// call sends a request; a 4xx or 5xx stops the program with spoold's
// {"kind", "message"}.
func call(method, path, body string, headers map[string]string) (*http.Response, []byte) {
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		log.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Spooler-Api-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		log.Fatal(err)
	}
	if resp.StatusCode >= 400 {
		log.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, data)
	}
	return resp, data
}

func check(ok bool, what string) {
	if !ok {
		log.Fatalf("expected %s", what)
	}
}

func main() {
	call("PUT", "/v1/queues/examples", `{"leaseTimeoutSeconds": 30, "maxRetries": 5}`, nil)
	call("PUT", "/v1/queues/examples-hooks",
		`{"destination": "http://127.0.0.1:9/hooks", "dedupWindowSeconds": 600}`, nil)

	resp, data := call("POST", "/v1/queues/examples/messages", `{"order": 42}`, nil)
	check(resp.StatusCode == 201, "201 after the fsync")
	var stored struct{ ID string }
	check(json.Unmarshal(data, &stored) == nil, "a JSON answer")

	// Receive: long-poll up to 5 s; the payload is the body, the lease the headers.
	resp, data = call("POST", "/v1/queues/examples/receive?wait=5", "", nil)
	check(resp.Header.Get("Spooler-Message-Id") == stored.ID, "the message sent")
	check(bytes.Equal(data, []byte(`{"order": 42}`)), "the payload")
	token := resp.Header.Get("Spooler-Lease-Token")

	// The work failed: give it back now (its retry count rises).
	resp, _ = call("POST", "/v1/queues/examples/leases/"+token+"/nack?delay=0", "", nil)
	check(resp.StatusCode == 204, "204 for the nack")

	resp, _ = call("POST", "/v1/queues/examples/receive?wait=5", "", nil)
	check(resp.Header.Get("Spooler-Retry-Count") == "1", "retry count 1")
	token = resp.Header.Get("Spooler-Lease-Token")

	// Long work: extend the lease, then ack (204 once the removal is durable).
	_, data = call("POST", "/v1/queues/examples/leases/"+token+"/renew", "", nil)
	check(bytes.Contains(data, []byte("leaseExpiresAt")), "a new expiry")
	resp, _ = call("POST", "/v1/queues/examples/leases/"+token+"/ack", "", nil)
	check(resp.StatusCode == 204, "204 for the ack")

	// Forward the same request twice with one idempotency key: stored once
	// (202), then answered from the dedup window (200, the same delivery id).
	var ids []string
	for _, expected := range []int{202, 200} {
		resp, _ = call("POST", "/v1/forward/examples-hooks/invoices/7?notify=1", `{"amount": 10}`,
			map[string]string{"Spooler-Idempotency-Key": "invoice-7"})
		check(resp.StatusCode == expected, fmt.Sprintf("%d for the forward", expected))
		ids = append(ids, resp.Header.Get("Spooler-Delivery-Id"))
	}
	check(resp.Header.Get("Spooler-Deduplicated") == "true", "the duplicate flagged")
	check(ids[0] == ids[1], "one delivery id")
	fmt.Println("ok", stored.ID, ids[0])
}
