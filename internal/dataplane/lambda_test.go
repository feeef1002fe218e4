package dataplane

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/smithy-go"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/auth"
)

// lambdaSandbox echoes the payload; a payload "fail" makes it answer 500.
func lambdaSandbox(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	if string(b) == `"fail"` {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte("it broke"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"got":` + string(b) + `,"path":"` + r.URL.Path + `","sig":"` + r.Header.Get("Authorization") + `"}`))
}

func lambdaClient(url, keyID, secret string) *lambda.Client {
	return lambda.New(lambda.Options{
		Region:           "us-east-1",
		BaseEndpoint:     aws.String(url),
		RetryMaxAttempts: 1,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: keyID, SecretAccessKey: secret}, nil
		}),
	})
}

func apiErrorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// The AWS SDK for Go's Lambda client, unmodified, against a data plane.
func TestLambdaInvokeWithTheAWSSDK(t *testing.T) {
	d, ts := newAsyncDP(t)
	addr := newSandbox(t, lambdaSandbox)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello", func(s *briskv1.FunctionSpec) {
		s.Resources = &briskv1.Resources{MemoryMb: 256}
		s.TimeoutMs = 30_000
	}), fnSpec("secret-fn")}, Added: []*briskv1.Endpoint{ep("hello", "sb-1", addr)}})
	tok, grant, err := auth.New([]string{auth.ScopeInvoke}, []string{"hello"}, "")
	if err != nil {
		t.Fatal(err)
	}
	other, otherGrant, _ := auth.New([]string{auth.ScopeInvoke}, []string{"someone-else"}, "")
	d.applyAuth(&briskv1.AuthConfig{Enabled: true, Tokens: []*briskv1.TokenGrant{
		{Id: grant.ID, Hash: grant.Hash, Scopes: grant.Scopes, Functions: grant.Functions, SigningKey: grant.SigningKey},
		{Id: otherGrant.ID, Hash: otherGrant.Hash, Scopes: otherGrant.Scopes, Functions: otherGrant.Functions, SigningKey: otherGrant.SigningKey},
	}})
	keyID, secret, _ := auth.AWSCredentials(tok)
	cl := lambdaClient(ts.URL, keyID, secret)
	ctx := context.Background()

	for _, name := range []string{"hello", "hello:$LATEST", "arn:aws:lambda:us-east-1:123456789012:function:hello", "123456789012:function:hello"} {
		out, err := cl.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(name), Payload: []byte(`{"k":1}`)})
		if err != nil {
			t.Fatalf("invoke %s: %v", name, err)
		}
		if out.StatusCode != 200 || out.FunctionError != nil || !strings.Contains(string(out.Payload), `"got":{"k":1}`) || aws.ToString(out.ExecutedVersion) != "$LATEST" {
			t.Fatalf("invoke %s: %d %v %s", name, out.StatusCode, aws.ToString(out.FunctionError), out.Payload)
		}
		if strings.Contains(string(out.Payload), "AWS4") {
			t.Fatalf("the signature reached the function: %s", out.Payload)
		}
	}
	out, err := cl.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("hello"), Payload: []byte(`"fail"`), LogType: types.LogTypeTail})
	if err != nil || aws.ToString(out.FunctionError) != "Unhandled" || !strings.Contains(string(out.Payload), "it broke") {
		t.Fatalf("function error: %v %+v %s", err, out, out.Payload)
	}
	if logs, _ := base64.StdEncoding.DecodeString(aws.ToString(out.LogResult)); !strings.Contains(string(logs), "REPORT RequestId") {
		t.Fatalf("log tail %q", logs)
	}
	out, err = cl.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("hello"), InvocationType: types.InvocationTypeDryRun})
	if err != nil || out.StatusCode != http.StatusNoContent {
		t.Fatalf("dry run: %v %+v", err, out)
	}
	out, err = cl.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("hello"), InvocationType: types.InvocationTypeEvent, Payload: []byte(`{"e":2}`)})
	if err != nil || out.StatusCode != http.StatusAccepted {
		t.Fatalf("event: %v %+v", err, out)
	}
	rec := eventResult(t, d, "hello")
	if !strings.Contains(string(rec.Result.Body), `"got":{"e":2}`) {
		t.Fatalf("event result %s", rec.Result.Body)
	}

	// ListFunctions and GetFunction show what the token may invoke.
	list, err := cl.ListFunctions(ctx, &lambda.ListFunctionsInput{})
	if err != nil || len(list.Functions) != 1 || aws.ToString(list.Functions[0].FunctionName) != "hello" ||
		aws.ToInt32(list.Functions[0].MemorySize) != 256 || aws.ToInt32(list.Functions[0].Timeout) != 30 {
		t.Fatalf("ListFunctions: %v %+v", err, list)
	}
	got, err := cl.GetFunction(ctx, &lambda.GetFunctionInput{FunctionName: aws.String("hello")})
	if err != nil || aws.ToString(got.Configuration.FunctionArn) != "arn:aws:lambda:us-east-1:000000000000:function:hello" {
		t.Fatalf("GetFunction: %v %+v", err, got)
	}
	if _, err := cl.GetFunction(ctx, &lambda.GetFunctionInput{FunctionName: aws.String("secret-fn")}); apiErrorCode(err) != "ResourceNotFoundException" {
		t.Fatalf("GetFunction of a function the token may not call: %v", err)
	}

	for _, c := range []struct {
		cl   *lambda.Client
		name string
		code string
	}{
		{cl, "nope", "ResourceNotFoundException"},
		{cl, "hello:prod", "ResourceNotFoundException"}, // no aliases yet
		{lambdaClient(ts.URL, keyID, secret+"x"), "hello", "InvalidSignatureException"},
		{lambdaClient(ts.URL, "AKIAEXAMPLE", secret), "hello", "UnrecognizedClientException"},
		{lambdaClient(ts.URL, func() string { k, _, _ := auth.AWSCredentials(other); return k }(), func() string { _, s, _ := auth.AWSCredentials(other); return s }()), "hello", "AccessDeniedException"},
	} {
		_, err := c.cl.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(c.name), Payload: []byte(`{}`)})
		if got := apiErrorCode(err); got != c.code {
			t.Errorf("invoke %s: error %v (code %q), want %s", c.name, err, got, c.code)
		}
	}
}

// eventResult awaits the one Event call of function fn and returns its
// record.
func eventResult(t *testing.T, d *DataPlane, fn string) async.Record {
	t.Helper()
	var rec async.Record
	waitFor(t, "the event call to finish", func() bool {
		recs, err := d.cfg.Async.List(context.Background(), async.Filter{Function: fn})
		if err != nil || len(recs) != 1 {
			return false
		}
		rec = recs[0]
		return rec.Status == async.StatusSucceeded
	})
	return rec
}

// ListFunctions pages as AWS's does (issue 38: MaxItems and Marker were
// ignored): the SDK's paginator walks every function a page at a time.
func TestLambdaListFunctionsPages(t *testing.T) {
	d, ts := newAsyncDP(t)
	var specs []*briskv1.FunctionSpec
	for _, n := range []string{"fa", "fb", "fc", "fd", "fe"} {
		specs = append(specs, fnSpec(n))
	}
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: specs})
	tok, grant, err := auth.New([]string{auth.ScopeInvoke}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	d.applyAuth(&briskv1.AuthConfig{Enabled: true, Tokens: []*briskv1.TokenGrant{
		{Id: grant.ID, Hash: grant.Hash, Scopes: grant.Scopes, SigningKey: grant.SigningKey}}})
	keyID, secret, _ := auth.AWSCredentials(tok)
	cl := lambdaClient(ts.URL, keyID, secret)
	pages := lambda.NewListFunctionsPaginator(cl, &lambda.ListFunctionsInput{MaxItems: aws.Int32(2)})
	var names []string
	n := 0
	for pages.HasMorePages() {
		out, err := pages.NextPage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Functions) > 2 {
			t.Fatalf("a page of %d with MaxItems 2", len(out.Functions))
		}
		for _, f := range out.Functions {
			names = append(names, aws.ToString(f.FunctionName))
		}
		if n++; n > 10 {
			t.Fatal("the pages do not end")
		}
	}
	if strings.Join(names, ",") != "fa,fb,fc,fd,fe" || n != 3 {
		t.Fatalf("paged %v in %d pages, want every function in 3", names, n)
	}
	if _, err := cl.ListFunctions(context.Background(), &lambda.ListFunctionsInput{MaxItems: aws.Int32(0)}); apiErrorCode(err) != "InvalidParameterValueException" {
		t.Fatalf("MaxItems 0: %v", err)
	}
}
