// An app backend talking to appleid-broker, in Go with nothing but its standard library.
//
//	go run . login    -broker URL -key LOGIN_KEY -identity-token T -authorization-code C -raw-nonce N
//	go run . webhooks -broker URL -key ADMIN_KEY -port 9000 [-exit-after user.created] [-record FILE]
//	go run . feed     -broker URL -key EVENTS_KEY -cursor-file FILE
//
// The nonce: the app makes a random raw nonce on the device, puts its lowercase hex SHA-256
// into the Apple request, and sends the raw one to this backend, which passes it as
// raw_nonce (HashNonce is what the app computes). Webhooks follow Standard Webhooks; for
// production prefer the official library, github.com/standard-webhooks/standard-webhooks.
package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

var (
	brokerURL  = flag.String("broker", "http://127.0.0.1:8080", "the broker's base URL")
	apiKey     = flag.String("key", "", "an API key with the command's scope")
	token      = flag.String("identity-token", "", "login: the identity token")
	code       = flag.String("authorization-code", "", "login: the authorization code")
	rawNonce   = flag.String("raw-nonce", "", "login: the raw nonce the app made")
	port       = flag.Int("port", 9000, "webhooks: port to listen on (127.0.0.1)")
	exitAfter  = flag.String("exit-after", "", "webhooks: stop after the first event of this type")
	record     = flag.String("record", "", "webhooks: append each verified delivery to this file")
	readyFile  = flag.String("ready-file", "", "webhooks: write this file once subscribed")
	cursorFile = flag.String("cursor-file", "", "feed: where the cursor is kept")
)

// NewRawNonce and HashNonce are what the app does for every sign-in.
func NewRawNonce() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func HashNonce(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return hex.EncodeToString(sum[:])
}

// Problem is the broker's RFC 9457 error body: switch on Code.
type Problem struct {
	Status int    `json:"status"`
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

func (p *Problem) Error() string { return p.Code + ": " + p.Detail }

func call(method, path string, body any, out any) error {
	var reader io.Reader
	if body != nil {
		encoded, err := json.Marshal(body)
		if err != nil {
			return err
		}
		reader = bytes.NewReader(encoded)
	}
	request, err := http.NewRequest(method, *brokerURL+path, reader)
	if err != nil {
		return err
	}
	request.Header.Set("Authorization", "Bearer "+*apiKey)
	request.Header.Set("Content-Type", "application/json")
	client := http.Client{Timeout: 15 * time.Second}
	response, err := client.Do(request)
	if err != nil {
		return err
	}
	defer response.Body.Close()
	data, err := io.ReadAll(response.Body)
	if err != nil {
		return err
	}
	if response.StatusCode >= 300 {
		problem := &Problem{Status: response.StatusCode}
		_ = json.Unmarshal(data, problem)
		return problem
	}
	if out != nil && len(data) > 0 {
		return json.Unmarshal(data, out)
	}
	return nil
}

func login() error {
	body := map[string]string{"identity_token": *token, "raw_nonce": *rawNonce}
	if *code != "" {
		body["authorization_code"] = *code
	}
	var answer map[string]any
	if err := call("POST", "/v1/apple/login", body, &answer); err != nil {
		return err
	}
	// Start your own session for answer["user_id"]; "email" is verified, "unverified_email" never is.
	encoded, _ := json.Marshal(answer)
	fmt.Println(string(encoded))
	return nil
}

// Verify checks a Standard Webhooks signature: HMAC-SHA256 over "id.timestamp.body".
func Verify(secret []byte, header http.Header, body []byte, now time.Time) bool {
	id, timestamp := header.Get("webhook-id"), header.Get("webhook-timestamp")
	seconds, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil || math.Abs(float64(now.Unix()-seconds)) > 300 {
		return false
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(id + "." + timestamp + "."))
	mac.Write(body)
	expected := mac.Sum(nil)
	for _, entry := range strings.Fields(header.Get("webhook-signature")) {
		version, signature, found := strings.Cut(entry, ",")
		given, err := base64.StdEncoding.DecodeString(signature)
		if found && version == "v1" && err == nil && hmac.Equal(given, expected) {
			return true
		}
	}
	return false
}

func webhooks() error {
	var subscription struct {
		ID     string `json:"id"`
		Secret string `json:"secret"`
	}
	err := call("POST", "/v1/webhook-subscriptions", map[string]any{
		"url": fmt.Sprintf("http://127.0.0.1:%d/hooks/appleid", *port), "topics": []string{"*"}, "description": "examples/go",
	}, &subscription)
	if err != nil {
		return err
	}
	secret, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(subscription.Secret, "whsec_"))
	if err != nil {
		return err
	}
	done := make(chan struct{})
	var once sync.Once
	var mutex sync.Mutex
	seen := map[string]bool{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil || !Verify(secret, r.Header, body, time.Now()) {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintln(os.Stderr, "refused a delivery with a bad signature or timestamp")
			return
		}
		w.WriteHeader(http.StatusNoContent)
		mutex.Lock()
		defer mutex.Unlock()
		id := r.Header.Get("webhook-id")
		if seen[id] {
			return // at least once: a retry of something handled
		}
		seen[id] = true
		var event struct {
			ID, Type, Timestamp string
			Data                map[string]any
		}
		if json.Unmarshal(body, &event) != nil {
			return
		}
		if *record != "" {
			line, _ := json.Marshal(map[string]any{"secret": subscription.Secret, "body": string(body), "headers": map[string]string{
				"webhook-id": id, "webhook-timestamp": r.Header.Get("webhook-timestamp"), "webhook-signature": r.Header.Get("webhook-signature"),
			}})
			file, err := os.OpenFile(*record, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
			if err == nil {
				file.Write(append(line, '\n'))
				file.Close()
			}
		}
		data, _ := json.Marshal(event.Data)
		fmt.Printf("%s %s %s %s\n", event.Timestamp, event.Type, event.ID, data)
		if event.Type == *exitAfter {
			once.Do(func() { close(done) })
		}
	})
	server := &http.Server{Addr: fmt.Sprintf("127.0.0.1:%d", *port), Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = server.ListenAndServe() }()
	fmt.Printf("subscribed %s, listening on %d\n", subscription.ID, *port)
	if *readyFile != "" {
		_ = os.WriteFile(*readyFile, []byte(subscription.ID), 0o600)
	}
	<-done
	time.Sleep(100 * time.Millisecond) // let the last 204 go out
	_ = call("DELETE", "/v1/webhook-subscriptions/"+subscription.ID, nil, nil)
	return server.Close()
}

func feed() error {
	// The cursor is the only state: keep it durably, and after handling a page, not before.
	cursor := ""
	if *cursorFile != "" {
		if saved, err := os.ReadFile(*cursorFile); err == nil {
			cursor = strings.TrimSpace(string(saved))
		}
	}
	count := 0
	for {
		path := "/v1/events?limit=100"
		if cursor != "" {
			path += "&after=" + url.QueryEscape(cursor)
		}
		var page struct {
			Events []struct {
				ID     string  `json:"id"`
				Type   string  `json:"type"`
				UserID *string `json:"user_id"`
			} `json:"events"`
			NextCursor string `json:"next_cursor"`
		}
		if err := call("GET", path, nil, &page); err != nil {
			return err
		}
		for _, event := range page.Events {
			user := "-"
			if event.UserID != nil {
				user = *event.UserID
			}
			fmt.Printf("%s %s %s\n", event.ID, event.Type, user)
			count++
		}
		if len(page.Events) == 0 || page.NextCursor == cursor {
			break
		}
		cursor = page.NextCursor
		if *cursorFile != "" {
			if err := os.WriteFile(*cursorFile, []byte(cursor), 0o600); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(os.Stderr, "%d new events\n", count)
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: go run . login|webhooks|feed -broker URL -key KEY …")
		os.Exit(2)
	}
	command := os.Args[1]
	_ = flag.CommandLine.Parse(os.Args[2:])
	commands := map[string]func() error{"login": login, "webhooks": webhooks, "feed": feed}
	run, ok := commands[command]
	if !ok {
		fmt.Fprintln(os.Stderr, "usage: go run . login|webhooks|feed -broker URL -key KEY …")
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
