// The conformance matrix's application on Node's own http server: the same endpoints as wsgi.py.
const http = require('http');
const SLOW_MS = 600;
http.createServer((req, res) => {
  if (req.method === 'POST') {
    let length = 0;
    req.on('data', (chunk) => { length += chunk.length; });
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end(`got ${length}\n`);
    });
    return;
  }
  const answer = () => {
    if (req.url === '/204') { res.writeHead(204); res.end(); return; }
    if (req.url === '/304') { res.writeHead(304, { etag: '"v1"' }); res.end(); return; }
    res.writeHead(200, { 'content-type': 'text/plain', etag: '"v1"' });
    res.end('hello\n');
  };
  if (req.url === '/slow') setTimeout(answer, SLOW_MS); else answer();
}).listen(Number(process.argv[2]), '127.0.0.1');
