package client_test

import (
	"context"
	"fmt"

	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Deploy a function, call it, then call it asynchronously and wait for the
// result.
func Example() {
	ctx := context.Background()
	c := client.New("127.0.0.1:9090", "127.0.0.1:8080")
	c.Token = "brisk_..." // brisk token create, or <data-dir>/admin.token
	if _, err := c.Create(ctx, &spec.Function{Name: "hello", Builtin: "trace"}); err != nil && !client.IsConflict(err) {
		fmt.Println(err)
		return
	}
	res, err := c.InvokeFunction(ctx, "hello", "POST", []byte(`{"ms": 5}`), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Status, string(res.Body))
	id, err := c.InvokeAsync(ctx, "hello", "POST", []byte(`{"ms": 5}`), nil, "")
	if err != nil {
		fmt.Println(err)
		return
	}
	rec, err := c.WaitCall(ctx, id)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(rec.Status, rec.Attempts, string(rec.Result.Body))
}
