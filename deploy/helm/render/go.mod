module spoold.example/helm-render

go 1.19
